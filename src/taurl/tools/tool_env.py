"""`ToolEnv`: a messages-style env over a `ToolBox`, the host gate and the reward stack.

One step = one assistant message = at most one tool call (`taurl.tools.executor`).
`step` is synchronous (the Env protocol); `astep` is the same step for async callers, so
a rollout that awaits it keeps other episodes running while tools and verifiers work.
The episode ends when

* the submit tool runs: a fresh verifier judges the submission → terminated
  (``stop_reason="answered"``), reward from the stack;
* the gate denies a call under a truncating rule → truncated with the rule's stop reason
  and its penalty as a constraint violation;
* `max_consecutive_errors` tool failures in a row → truncated, ``stop_reason="error"``
  (the tools, not the agent, failed: an invalid sample);
* `max_turns` actions → truncated, ``stop_reason="max_turns"``.

The last step carries ``reward_components`` (outcome / constraint / shaping; they sum to
the step's reward), ``verifier_version`` and ``violations``; earlier steps reward 0. The
rule names of the violations are also in that step's ``info["action"]["violations"]``, so
the stored trajectory shows each flag; the verifier's own detections (cheats) are also in
``info["action"]["cheats"]``, and when the verifier voided its score, the score the tests
alone gave is there too (``info["action"]["score_before_void"]``).

Subclasses set up the task's world in `_start`, hand the verifier a snapshot in
`_submission` (by default: what the submit tool returned), and release resources in `_end`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from taurl.data.task import Task
from taurl.errors import ConfigError, ResetNeeded
from taurl.reward.stack import Judge, RewardStack, Verdict, Violation
from taurl.tools.executor import CallOutcome, ToolBox, run_blocking
from taurl.tools.gate import Gate, GateConfig
from taurl.tools.specs import ToolSpec

DEFAULT_STACK = RewardStack(shaping_weights={"invalid_actions": -0.02}, shaping_clip=0.1)


class ToolEnv:
    """A tool-calling env (module docstring). Instances serve one episode at a time."""

    name = "tools-v0"
    version = "1"
    observation_style = "messages"
    stop = ("</tool_call>",)  # one call per message; a special token in taurl's tokenizer
    system_prompt = ""

    def __init__(self, tools: Sequence[ToolSpec], *, verifier_factory: Callable[[], Judge],
                 gate: GateConfig | None = None, stack: RewardStack | None = None,
                 max_turns: int = 8, submit_tool: str = "submit", max_consecutive_errors: int = 3,
                 parser: str = "hermes",
                 default_timeout_s: float = 30.0, max_output_chars: int = 8000,
                 call_example: str | None = None) -> None:
        problems = []
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            problems.append(f"max_turns must be an int >= 1, got {max_turns!r}")
        if not isinstance(max_consecutive_errors, int) or max_consecutive_errors < 1:
            problems.append("max_consecutive_errors must be an int >= 1, got "
                            f"{max_consecutive_errors!r}")
        if submit_tool not in {t.name for t in tools}:
            problems.append(f"submit_tool {submit_tool!r} is not among the tools "
                            f"{[t.name for t in tools]}")
        if not callable(verifier_factory):
            problems.append("verifier_factory must be a callable returning a fresh Judge "
                            "(taurl.reward.stack)")
        if problems:
            raise ConfigError(problems)
        self.toolbox = ToolBox(tools, parser=parser, default_timeout_s=default_timeout_s,
                               max_output_chars=max_output_chars,
                               **({"example": call_example} if call_example else {}))
        self.tools = self.toolbox.declarations
        self.gate_config = gate or GateConfig()
        self.stack = stack or DEFAULT_STACK
        self.max_turns = max_turns
        self.submit_tool = submit_tool
        self.max_consecutive_errors = max_consecutive_errors
        self.verifier_factory = verifier_factory
        self.verifier_version = verifier_factory().version
        self._task: Task | None = None
        self._done = True
        self._gate: Gate | None = None
        self._turn = 0
        self._violations: list[Violation] = []
        self._signals: dict[str, float] = {}
        self._errors_in_a_row = 0

    # -- hooks for subclasses ------------------------------------------------------------
    def _start(self, task: Task, seed: int | None) -> dict[str, Any]:
        """Set up the episode's world; returns extra reset info."""
        return {}

    def _submission(self, value: Any) -> Any:
        """What the verifier judges; `value` is what the submit tool returned (the default)."""
        return value

    def _end(self) -> None:
        """Release the episode's resources (called once per episode, also on reset)."""

    def _verdict_text(self, verdict: Verdict) -> str:
        """The last observation: what the verifier said of the submission."""
        return _verdict_text(verdict)

    # -- the protocol -------------------------------------------------------------------
    def make_verifier(self) -> Judge:
        """A fresh verifier instance: what the holdout evaluator uses."""
        return self.verifier_factory()

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if task.env != self.name:
            raise ConfigError(f"task {task.task_id!r} is for env {task.env!r}, not {self.name!r}; "
                              "make the env the task names")
        if self._task is not None and not self._done:
            self._end()
        allow = task.metadata.get("allowed_tools")
        self._gate = Gate(list(self.toolbox.specs.values()), self.gate_config, allow)
        self._task, self._done, self._turn, self._errors_in_a_row = task, False, 0, 0
        self._violations, self._signals = [], {"invalid_actions": 0.0, "tool_errors": 0.0}
        info = {"task_id": task.task_id, "seed": seed, "env": self.name,
                "env_version": self.version,
                "verifier_version": self.verifier_version, "max_turns": self.max_turns}
        try:
            info.update(self._start(task, seed))
        except BaseException:
            self._done = True  # no half-made episode: step raises ResetNeeded
            raise
        return "", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """`astep` run to completion on the tools' background loop (callable inside a loop)."""
        if self._task is None or self._done or self._gate is None:
            raise ResetNeeded(f"{type(self).__name__}.step called before reset() or after the "
                              "episode ended; call reset(task) first")
        return run_blocking(self.astep(action))

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """`step` for async callers: the tools and the verifier run on the caller's loop."""
        if self._task is None or self._done or self._gate is None:
            raise ResetNeeded(f"{type(self).__name__}.step called before reset() or after the "
                              "episode ended; call reset(task) first")
        self._turn += 1
        out = await self.toolbox.step(action, self._gate)
        info: dict[str, Any] = {"action": _action_dict(out), "invalid": out.invalid,
                                "turn": self._turn}
        if out.receipt is not None:
            info["receipt"] = out.receipt
        if out.error:
            info["error"] = out.error
        self._signals["invalid_actions"] += out.invalid
        self._signals["tool_errors"] += out.error is not None
        self._errors_in_a_row = self._errors_in_a_row + 1 if out.error else 0
        d = out.decision
        if d is not None and not d.allowed and (d.truncate or d.penalty):
            self._violations.append(Violation(d.rule, d.reason, d.penalty, d.truncate,
                                              voids_outcome=False))
        obs = out.observation
        if d is not None and not d.allowed and d.truncate:
            return obs, self._finish(info, None, d.stop_reason), False, True, info
        if out.call is not None and out.call.name == self.submit_tool and out.status == "ok":
            verdict = await _judge(self.make_verifier(), self._task, self._submission(out.value))
            stop = "error" if verdict.error else "answered"
            reward = self._finish(info, verdict, stop)
            return (self._verdict_text(verdict), reward, verdict.error is None,
                    verdict.error is not None, info)
        if self._errors_in_a_row >= self.max_consecutive_errors:
            return obs, self._finish(info, None, "error"), False, True, info
        if self._turn >= self.max_turns:
            return obs, self._finish(info, None, "max_turns"), False, True, info
        return obs, 0.0, False, False, info

    def _finish(self, info: dict[str, Any], verdict: Verdict | None, stop_reason: str) -> float:
        outcome = verdict.score if verdict is not None and verdict.error is None else 0.0
        violations = [*self._violations, *(verdict.violations if verdict is not None else ())]
        breakdown = self.stack.combine(outcome, violations, self._signals,
                                       verifier_version=self.verifier_version)
        info.update(breakdown.info(), stop_reason=stop_reason)
        if violations:
            info["action"] = {**info["action"], "violations": sorted({v.rule for v in violations})}
        if verdict is not None and verdict.violations:
            # the verifier's detections: cheats (evaluate.safety_figures)
            info["action"] = {**info["action"],
                              "cheats": sorted({v.rule for v in verdict.violations})}
        if verdict is not None and verdict.score_before_void is not None:
            # kept on the submit turn (the trajectory keeps actions, not info): what the tests gave
            info["action"] = {**info["action"], "score_before_void": verdict.score_before_void}
        if verdict is not None:
            info["verdict"] = {"score": verdict.score, "detail": verdict.detail,
                               "error": verdict.error,
                               "score_before_void": verdict.score_before_void,
                               **dict(verdict.metrics)}
            if verdict.error:
                info["error"] = f"verifier: {verdict.error}"
        self._done = True
        self._end()
        return breakdown.total

    def close(self) -> None:
        if self._task is not None and not self._done:
            self._done = True
            self._end()


async def _judge(verifier: Judge, task: Task, submission: Any) -> Verdict:
    """The verifier's verdict; a verifier that raises gives an error verdict (invalid sample)."""
    try:
        averify = getattr(verifier, "averify", None)
        if averify is not None:
            return await averify(task, submission)
        return await asyncio.to_thread(verifier.verify, task, submission)
    except Exception as e:  # noqa: BLE001 — the episode ends cleanly either way
        return Verdict(0.0, getattr(verifier, "version", ""),
                       error=f"verifier raised {type(e).__name__}: {e}")


def _action_dict(out: CallOutcome) -> dict[str, Any]:
    if out.call is None:
        return {"kind": "invalid", "parse": out.parse_kind}
    receipt_args = out.receipt.arguments if out.receipt is not None else {}
    return {"kind": "tool_call", "name": out.call.name[:200], "arguments": receipt_args}


def _verdict_text(v: Verdict) -> str:
    if v.error:
        return f"Submission received, but it could not be checked: {v.error}"
    return ("Submission received: all hidden tests passed." if v.passed
            else f"Submission received: {v.detail}")
