"""Holdout evaluation: the holdout split only, an independent verifier, k trials per task.

The evaluator never trusts the training signal. Each episode is re-scored by its own
`HoldoutVerifier` instance from the final answer in the record (never the env's reward,
which is what training saw); disagreements are counted, not repaired. Tasks from any
split but "holdout" are refused, and the search env's holdout split shares no entity
with training (`taurl.envs.search.questions`).

Figures (`EvalResult`):

* success: verified successes / episodes, with a 95% Wilson score interval
  (Wilson 1927): centre (p̂ + z²/2n) / (1 + z²/n), half-width
  z·sqrt(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n), z = 1.96;
* pass@k: the unbiased estimator of Chen et al. 2021 (arXiv 2107.03374, Eq. 1),
  1 − C(n−c, k) / C(n, k) averaged over tasks (n trials, c successes; with n = k it is
  "any trial succeeded");
* search_rate (episodes with >= 1 tool call), tool_calls_mean, tokens_mean (all tokens),
  action_tokens_mean, invalid_rate (invalid actions / actions), truncation_rate and the
  share of each stop reason.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from taurl.envs.core import Task
from taurl.errors import Error
from taurl.reward.exact_match import VERIFIER_VERSION, exact_match
from taurl.trajectory import Trajectory


@dataclass(frozen=True)
class EvalConfig:
    """How the holdout evaluation runs."""

    tasks: int = 100  # holdout tasks per evaluation
    trials: int = 3  # k: episodes per task (pass@k uses them all)
    temperature: float = 1.0  # sampling temperature of the evaluated policy
    seed: int = 1234  # seeds the choice of holdout tasks and the sampling
    concurrency: int = 64  # episodes in flight at once

    def problems(self) -> list[str]:
        return [f"eval {k} must be >= 1 (got {getattr(self, k)})" for k in ("tasks", "trials", "concurrency")
                if getattr(self, k) < 1] + (["eval temperature must be >= 0"] if self.temperature < 0 else [])


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (module docstring); (0, 1) if n = 0.

    >>> [round(x, 4) for x in wilson_interval(5, 10)]
    [0.2366, 0.7634]
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n trials with c successes (Chen et al. 2021, Eq. 1).

    >>> pass_at_k(3, 1, 3), pass_at_k(3, 0, 3), round(pass_at_k(4, 1, 2), 4)
    (1.0, 0.0, 0.5)
    """
    if k > n:
        raise Error(f"pass@{k} needs at least {k} trials per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


class HoldoutVerifier:
    """The evaluator's own exact-match verifier: re-scores a record from its final answer."""

    version = VERIFIER_VERSION

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, traj: Trajectory, task: Task) -> float:
        self.calls += 1
        last = traj.turns[-1].action if traj.turns else {}
        if last.get("kind") != "answer" or not traj.terminated:
            return 0.0
        return exact_match(str(last.get("answer", "")), task.answers)


@dataclass(frozen=True)
class EvalResult:
    """The figures of one holdout evaluation (module docstring)."""

    success: float
    ci95: tuple[float, float]
    episodes: int
    tasks: int
    trials: int
    pass_at_k: float
    search_rate: float
    tool_calls_mean: float
    tokens_mean: float
    action_tokens_mean: float
    turns_mean: float
    invalid_rate: float
    truncation_rate: float
    stop_reasons: dict[str, float] = field(default_factory=dict)
    verifier_disagreements: int = 0  # episodes where the env's reward and the holdout verifier differ
    policy_version: int = -1
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci95"] = list(self.ci95)
        return d

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """Flat, namespaced metrics (``eval/success`` …) for metrics.jsonl."""
        out = {f"{prefix}/{k}": float(v) for k, v in asdict(self).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out[f"{prefix}/ci95_low"], out[f"{prefix}/ci95_high"] = self.ci95
        return out


def check_holdout(tasks: Sequence[Task]) -> None:
    bad = sorted({t.split for t in tasks if t.split != "holdout"})
    if bad:
        raise Error(f"holdout evaluation got tasks of split(s) {bad}; evaluate on generate_tasks('holdout', ...) "
                    "only, so that no training signal has touched the evaluation")


def summarize(trajs: Sequence[Trajectory], tasks: Sequence[Task], trials: int,
              verifier: HoldoutVerifier | None = None, wall_s: float = 0.0) -> EvalResult:
    """Score `trajs` (k = `trials` per task of `tasks`) with a fresh verifier; see EvalResult."""
    check_holdout(tasks)
    verifier = verifier or HoldoutVerifier()
    by_id = {t.task_id: t for t in tasks}
    unknown = [t.task_id for t in trajs if t.task_id not in by_id]
    if unknown:
        raise Error(f"{len(unknown)} evaluated episode(s) belong to no given task (e.g. {unknown[0]!r})")
    n = len(trajs)
    verdicts = [verifier(t, by_id[t.task_id]) for t in trajs]
    wins = sum(v >= 1.0 for v in verdicts)
    per_task: dict[str, list[float]] = defaultdict(list)
    for t, v in zip(trajs, verdicts, strict=True):
        per_task[t.task_id].append(v)
    k = min([trials, *[len(v) for v in per_task.values()]]) if per_task else trials
    pak = (sum(pass_at_k(len(v), sum(x >= 1.0 for x in v), k) for v in per_task.values()) / len(per_task)
           if per_task else 0.0)
    actions = sum(len(t.turns) for t in trajs)
    stops = Counter(t.stop_reason.value for t in trajs if t.stop_reason)
    versions = {v for t in trajs for v in t.policy_versions}
    mean = (lambda xs: sum(xs) / n) if n else (lambda xs: 0.0)  # noqa: E731
    return EvalResult(
        success=wins / n if n else 0.0, ci95=wilson_interval(wins, n), episodes=n, tasks=len(per_task),
        trials=k, pass_at_k=pak,
        search_rate=mean([t.num_tool_calls > 0 for t in trajs]),
        tool_calls_mean=mean([t.num_tool_calls for t in trajs]),
        tokens_mean=mean([t.num_tokens for t in trajs]),
        action_tokens_mean=mean([t.num_action_tokens for t in trajs]),
        turns_mean=mean([len(t.turns) for t in trajs]),
        invalid_rate=sum(t.num_invalid_actions for t in trajs) / max(actions, 1),
        truncation_rate=mean([t.truncated for t in trajs]),
        stop_reasons={k2: c / n for k2, c in sorted(stops.items())},
        verifier_disagreements=sum((t.reward >= 1.0) != (v >= 1.0) for t, v in zip(trajs, verdicts, strict=True)),
        policy_version=max(versions) if len(versions) == 1 else -1,
        wall_s=wall_s,
    )
