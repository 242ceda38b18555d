"""The reward stack (docs/design.md#reward): outcome (dominant), constraints (hard), shaping
(small).

    r = w_o · outcome · [no violation voids it]            outcome ∈ [0, 1], from a Judge
      + Σ_v penalty_v                                      constraint: each ≤ 0
      + clip(Σ_s w_s · signal_s, −c, +c)                   process shaping, |·| ≤ c

Each layer is stored separately in ``info["reward_components"]`` under the keys
``outcome``, ``constraint`` and ``shaping``, so the components sum to the reward exactly
(the ledger checks it), and ``info["verifier_version"]`` names the outcome verifier.

A `Violation` is one broken constraint rule (a cheat, a forbidden tool, a budget): its
penalty, whether it truncates the episode, and whether it voids the outcome (tampering
with the tests must never pay, even when the code happens to be right).

Verifiers are built, not shared: an env holds a *factory* (`verifier_factory`) and calls
it per episode; the holdout evaluator calls the same factory (or its own) to get an
independent instance that has never seen training episodes and keeps no cache.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from taurl.errors import ConfigError


@dataclass(frozen=True)
class Violation:
    """One broken constraint rule.

    rule: a short stable name (``tests_modified``, ``early_exit``, ``forbidden_tool`` …).
    detail: what was seen, in words. penalty: added to the reward (≤ 0).
    truncate: the episode ends here. voids_outcome: the outcome counts as 0.
    """

    rule: str
    detail: str
    penalty: float = -1.0
    truncate: bool = False
    voids_outcome: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.penalty) and self.penalty <= 0):
            raise ConfigError(f"violation {self.rule!r}: penalty must be a finite number <= 0, got "
                              f"{self.penalty!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "detail": self.detail, "penalty": self.penalty,
                "truncate": self.truncate, "voids_outcome": self.voids_outcome}


@dataclass(frozen=True)
class Verdict:
    """What an outcome verifier decided about one terminal state.

    score: the outcome in [0, 1] (binary for unit tests). passed: score == 1.
    detail: why, in words (the first failing case, the integrity problem).
    violations: the cheats the verifier detected (each becomes a constraint penalty).
    error: the verifier itself could not judge (not the agent's fault): the episode is
    then an invalid sample rather than a zero.
    score_before_void: what the tests alone gave, before a violation voided `score` (None:
    nothing was voided, or the verifier does not void). Stored apart so a test can tell an
    exploit that fails on its own merits from one that only detection stops.
    """

    score: float
    version: str
    detail: str = ""
    violations: tuple[Violation, ...] = ()
    error: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    score_before_void: float | None = None

    @property
    def passed(self) -> bool:
        return self.score >= 1.0


@runtime_checkable
class Judge(Protocol):
    """A deterministic, versioned judge of a terminal state: its `Verdict`. No caches across calls.

    (Named apart from `taurl.envs.spec.Verifier`, the evaluator's ``(traj, task) -> score``:
    one name per protocol. ``Verifier`` below is this protocol's old name.)
    """

    version: str

    def verify(self, task: Any, submission: Any) -> Verdict: ...


Verifier = Judge  # the old name, kept importable


@dataclass(frozen=True)
class RewardBreakdown:
    total: float
    components: dict[str, float]
    verifier_version: str
    violations: tuple[Violation, ...] = ()

    def info(self) -> dict[str, Any]:
        """The keys an env puts in `info` on its last step."""
        return {"reward_components": dict(self.components),
                "verifier_version": self.verifier_version,
                "violations": [v.to_dict() for v in self.violations]}


@dataclass(frozen=True)
class RewardStack:
    """How the layers combine (module docstring). Shaping weights are per named signal."""

    outcome_weight: float = 1.0
    shaping_weights: Mapping[str, float] = field(default_factory=dict)
    shaping_clip: float = 0.1

    def __post_init__(self) -> None:
        problems = []
        if not self.outcome_weight > 0:
            problems.append("outcome_weight must be > 0 (it is the dominant layer), got "
                            f"{self.outcome_weight!r}")
        if not 0 <= self.shaping_clip < self.outcome_weight:
            problems.append("shaping_clip must be in [0, outcome_weight) so shaping never "
                            f"outweighs the outcome, got {self.shaping_clip!r}")
        problems += [f"shaping weight {k!r}={w!r} must be finite"
                     for k, w in self.shaping_weights.items()
                     if not math.isfinite(w)]
        if problems:
            raise ConfigError(problems)

    def combine(self, outcome: float, violations: Iterable[Violation] = (),
                signals: Mapping[str, float] | None = None, *,
                verifier_version: str) -> RewardBreakdown:
        """The reward of one episode and its components (they sum to `total`)."""
        if not (math.isfinite(outcome) and 0.0 <= outcome <= 1.0):
            raise ConfigError(f"outcome must be in [0, 1], got {outcome!r}; verifiers return "
                              "scores in [0, 1]")
        vs = tuple(violations)
        voided = any(v.voids_outcome for v in vs)
        components = {
            "outcome": 0.0 if voided else self.outcome_weight * outcome,
            "constraint": sum((v.penalty for v in vs), 0.0),
            "shaping": self.shaping(signals or {}),
        }
        return RewardBreakdown(sum(components.values()), components, verifier_version, vs)

    def shaping(self, signals: Mapping[str, float]) -> float:
        """clip(Σ_s w_s · signal_s, −c, +c); signals without a weight count 0."""
        raw = sum(self.shaping_weights.get(k, 0.0) * float(v) for k, v in signals.items())
        return max(-self.shaping_clip, min(self.shaping_clip, raw))
