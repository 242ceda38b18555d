"""The host gate (docs/design.md#safety): every parsed tool call passes here before it runs.

Checks, in order (the first that fails decides; its name is the `rule`):

=================  =======================================================================
rule               denies when
=================  =======================================================================
unknown_tool       the name is not a declared tool ("did you mean" in the reason)
not_allowed        the tool is outside the env's or the task's allow-list
scope              the tool needs a permission scope that is not granted
schema             the arguments break the tool's JSON Schema (all problems listed)
max_calls          the episode's call budget is spent
max_calls_per_tool that tool's call budget is spent
max_wall_s         the episode's tool wall-time budget is spent
max_cost           the call would exceed the episode's cost budget
approval           the tool needs approval (scope in `approval_scopes`) and the hook
                   refused it, or no hook is configured
=================  =======================================================================

What a denial does is configurable per rule (`RuleAction`): by default a hard rule
(``not_allowed``, ``scope``, the budgets) truncates the episode, forbidden tools with a
constraint penalty; the rest are an error observation the model can learn from. Budgets
count allowed calls only; the executor reports each call's wall time with `account`.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from taurl.errors import ConfigError
from taurl.tools.parsers import ToolCall
from taurl.tools.specs import SCOPES, ToolSpec, validate_arguments

RULES = ("unknown_tool", "not_allowed", "scope", "schema", "max_calls", "max_calls_per_tool",
         "max_wall_s", "max_cost", "approval")
BUDGET_RULES = frozenset({"max_calls", "max_calls_per_tool", "max_wall_s", "max_cost"})

# approve(call, spec) -> True to allow; False or a reason (str) to deny
ApprovalHook = Callable[[ToolCall, ToolSpec], "bool | str"]


@dataclass(frozen=True)
class RuleAction:
    """What a denial under one rule does. stop_reason applies when `truncate`.

    Forbidden tools end as ``tool_budget`` rather than ``error`` on purpose: ``error``
    marks an invalid sample (the learner drops it), and a penalty the learner never sees
    teaches nothing.
    """

    truncate: bool = False
    penalty: float = 0.0
    stop_reason: str = "tool_budget"


DEFAULT_RULES: Mapping[str, RuleAction] = {
    "not_allowed": RuleAction(truncate=True, penalty=-1.0),
    "scope": RuleAction(truncate=True, penalty=-1.0),
    **{r: RuleAction(truncate=True) for r in BUDGET_RULES},
}


@dataclass(frozen=True)
class GateConfig:
    """The env's policy. None means "no limit"; `allow` None means every declared tool."""

    allow: frozenset[str] | None = None
    scopes: frozenset[str] = frozenset({"read", "write", "execute"})
    max_calls: int | None = None
    max_calls_per_tool: Mapping[str, int] = field(default_factory=dict)
    max_wall_s: float | None = None
    max_cost: float | None = None
    approval_scopes: frozenset[str] = frozenset({"destructive"})
    approve: ApprovalHook | None = field(default=None, compare=False)
    rules: Mapping[str, RuleAction] = field(default_factory=lambda: dict(DEFAULT_RULES))

    def __post_init__(self) -> None:
        for name in ("allow", "scopes", "approval_scopes"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, frozenset):
                object.__setattr__(self, name, frozenset(value))
        problems = [f"unknown scope {s!r}; use {SCOPES}"
                    for s in sorted(self.scopes | self.approval_scopes)
                    if s not in SCOPES]
        problems += [f"unknown rule {r!r}; rules are {RULES}" for r in self.rules if r not in RULES]
        for key in ("max_calls", "max_wall_s", "max_cost"):
            v = getattr(self, key)
            if v is not None and not v > 0:
                problems.append(f"{key} must be > 0 or None, got {v!r}")
        problems += [f"max_calls_per_tool[{k!r}] must be an int >= 0, got {v!r}"
                     for k, v in self.max_calls_per_tool.items() if not isinstance(v, int) or v < 0]
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True)
class GateDecision:
    allowed: bool
    rule: str = ""  # the rule that denied the call
    reason: str = ""  # for the model and the receipt
    truncate: bool = False
    penalty: float = 0.0
    stop_reason: str = ""
    timeout_s: float | None = None  # allowed: the most this call may run (wall budget)


class Gate:
    """One episode's gate: the config, the declared tools and the budgets spent so far."""

    def __init__(self, specs: Sequence[ToolSpec], config: GateConfig | None = None,
                 task_allow: Sequence[str] | None = None) -> None:
        self.specs = {s.name: s for s in specs}
        self.config = config or GateConfig()
        self.task_allow = frozenset(task_allow) if task_allow is not None else None
        self.calls = 0
        self.per_tool: Counter[str] = Counter()
        self.wall_s = 0.0
        self.cost = 0.0

    def check(self, call: ToolCall) -> GateDecision:
        """Allow or deny `call` (module docstring); an allowed call is counted at once."""
        cfg = self.config
        spec = self.specs.get(call.name)
        if spec is None:
            close = difflib.get_close_matches(call.name, list(self.specs), n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            return self._deny("unknown_tool", f"there is no tool named {call.name[:80]!r}.{hint} "
                              f"Available tools: {', '.join(sorted(self.specs))}")
        for allow, whose in ((cfg.allow, "this environment"), (self.task_allow, "this task")):
            if allow is not None and call.name not in allow:
                return self._deny("not_allowed", f"tool {call.name!r} is not allowed in {whose}; "
                                  f"allowed: {', '.join(sorted(allow)) or 'none'}")
        missing = sorted(spec.scopes - cfg.scopes)
        if missing:
            return self._deny("scope", f"tool {call.name!r} needs the {'/'.join(missing)} "
                                       "permission, "
                              "which this environment does not grant")
        problems = validate_arguments(call.arguments, spec.parameters)
        if problems:
            return self._deny("schema", f"bad arguments for {call.name!r}: "
                                        f"{'; '.join(problems[:5])}. "
                              f"Expected: {_signature(spec)}")
        if cfg.max_calls is not None and self.calls >= cfg.max_calls:
            return self._deny("max_calls", f"the budget of {cfg.max_calls} tool calls per episode "
                                           "is spent")
        limit = cfg.max_calls_per_tool.get(call.name)
        if limit is not None and self.per_tool[call.name] >= limit:
            return self._deny("max_calls_per_tool", f"the budget of {limit} calls to {call.name!r} "
                                                    "is spent")
        if cfg.max_wall_s is not None and self.wall_s >= cfg.max_wall_s:
            return self._deny("max_wall_s", f"the {cfg.max_wall_s:g} s of tool time per episode "
                                            "are spent")
        if cfg.max_cost is not None and self.cost + spec.cost > cfg.max_cost:
            return self._deny("max_cost", f"calling {call.name!r} (cost {spec.cost:g}) would "
                                          "exceed the "
                              f"budget of {cfg.max_cost:g} ({self.cost:g} spent)")
        if spec.scopes & cfg.approval_scopes:
            try:
                verdict = (cfg.approve(call, spec) if cfg.approve is not None
                           else "no approver is configured")
            except Exception as e:  # noqa: BLE001 — a broken approver denies, it never crashes the rollout
                verdict = f"the approver failed ({type(e).__name__}: {e})"
            if verdict is not True:
                why = verdict if isinstance(verdict, str) and verdict else "the approver refused it"
                return self._deny("approval", f"tool {call.name!r} needs approval: {why}")
        self.calls += 1
        self.per_tool[call.name] += 1
        self.cost += spec.cost
        remaining = None if cfg.max_wall_s is None else max(cfg.max_wall_s - self.wall_s, 1e-3)
        return GateDecision(True, timeout_s=remaining)

    def account(self, wall_s: float) -> None:
        """Add an executed call's wall time to the episode's budget."""
        self.wall_s += max(0.0, wall_s)

    def _deny(self, rule: str, reason: str) -> GateDecision:
        action = self.config.rules.get(rule, RuleAction())
        return GateDecision(False, rule, reason, action.truncate, action.penalty,
                            action.stop_reason if action.truncate else "")


def _signature(spec: ToolSpec) -> str:
    props = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))

    def one(k: str, s: dict) -> str:
        typ = s.get("type", "any")
        typ = "|".join(typ) if isinstance(typ, list) else typ
        return f"{k}: {typ}" + ("" if k in required else " (optional)")

    return f"{spec.name}({', '.join(one(k, s) for k, s in props.items())})"
