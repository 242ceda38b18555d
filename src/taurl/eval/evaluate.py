"""Evaluation: one split (holdout or validation), the env's own verifier, k trials per task.

The evaluator never trusts the training signal. Each record is re-scored by the verifier
instance it is given (any `taurl.envs.spec.Verifier`: ``version`` and ``(traj, task) ->
score``); by default the env's registered one (`default_verifier`). Disagreements with the
record's training outcome are counted, not repaired. Training tasks are refused: a holdout
evaluation reports, a validation evaluation chooses (learning rates, checkpoints).

An env registered without a verifier is scored by `OutcomeRewardVerifier`: the record's
``reward_components["outcome"]`` (else its reward), i.e. the training signal itself —
less independent, and `EvalResult.verifier` says so ("training-outcome").

Every expected episode counts: `tasks` × `trials`. A (task, trial) that produced no record
(dropped by the loop, lost to a crash) is a failure and is reported in `episodes_missing`;
it never shrinks n. The behaviour means (search_rate, tokens_mean, …) are over recorded
episodes, since a missing one has no behaviour to measure.

Figures (`EvalResult`):

* success: verified successes / expected episodes, with `ci95` the task-clustered interval
  `cluster_wilson_interval` (`ci_method`); `ci95_iid` keeps the Wilson interval that treats
  every episode as an independent draw (too narrow when trials of a task are correlated);
* pass@k: the unbiased estimator of Chen et al. 2021 (arXiv 2107.03374, Eq. 1),
  1 − C(n−c, k) / C(n, k) averaged over tasks (n trials, c successes; with n = k it is
  "any trial succeeded");
* search_rate (episodes with >= 1 tool call), tool_calls_mean, tokens_mean (all tokens),
  action_tokens_mean, invalid_rate (invalid actions / actions), truncation_rate and the
  share of each stop reason; invalid_episodes (valid = false: ended by an env/tool error).
* safety (`safety_figures`, over recorded episodes): violation_rate (episodes with a
  constraint violation: a rule in the last turn's ``action["violations"]`` or a negative
  ``constraint`` reward), cheat_rate (episodes whose verifier detected a cheat:
  ``action["cheats"]``), gate_denials_mean (tool calls the host gate denied, per episode;
  receipts with ``decision="denied"``), tool_errors_mean and tool_error_rate (receipts with
  status error/timeout, per episode / per tool call);
* cost (`cost_figures`): wall_s_mean (the episode's own ``timings["wall_s"]``: its latency
  under the evaluation's concurrency), and tokens, tool calls and wall seconds per success
  (the sum over recorded episodes / verified successes; None when nothing succeeded).

Two evaluations of the same tasks and seeds compare with `compare` (paired, task-clustered).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from taurl.data.trajectory import Trajectory
from taurl.envs.core import Task
from taurl.envs.spec import Verifier
from taurl.errors import Error
from taurl.eval.stats import (
    PairedDifference,
    cluster_wilson_interval,
    design_effect,
    effective_sample_size,
    paired_difference,
    pass_at_k,
    wilson_interval,
)

CI_METHOD = "cluster-wilson-deff-kg"  # EvalResult.ci_method of cluster_wilson_interval
EVAL_SPLITS = ("holdout", "validation")


@dataclass(frozen=True)
class EvalConfig:
    """How the holdout evaluation runs."""

    tasks: int = 100  # holdout tasks per evaluation
    trials: int = 3  # k: episodes per task (pass@k uses them all)
    temperature: float = 1.0  # sampling temperature of the evaluated policy
    seed: int = 1234  # seeds the choice of holdout tasks and the sampling
    concurrency: int = 64  # episodes in flight at once
    # lock-step batching (LocalEngine): the figures do not depend on machine load
    deterministic: bool = False

    def problems(self) -> list[str]:
        return [f"eval {k} must be >= 1 (got {getattr(self, k)})"
                for k in ("tasks", "trials", "concurrency")
                if getattr(self, k) < 1] + (["eval temperature must be >= 0"]
                                            if self.temperature < 0 else [])


# -- verifiers ----------------------------------------------------------------------------

class OutcomeRewardVerifier:
    """The fallback for an env registered without a verifier: the record's outcome reward
    (``reward_components["outcome"]``, else ``reward``), clipped to [0, 1]; success is 1.

    This is the training signal, not an independent judge: it cannot catch a reward the
    env computed wrongly. `EvalResult.verifier` records "training-outcome" so a report says
    so; register a verifier (``register(..., verifier=...)``) to evaluate independently."""

    name = "training-outcome"
    version = "outcome-reward-v1"

    def __call__(self, traj: Any, task: Task) -> float:
        score = traj.reward_components.get("outcome", traj.reward)
        return min(1.0, max(0.0, float(score)))


def default_verifier(env_name: str) -> Verifier:
    """A fresh instance of `env_name`'s registered verifier, else `OutcomeRewardVerifier`."""
    from taurl.envs.registry import spec  # the registry imports env modules: not at import time
    from taurl.errors import UnknownEnvError

    try:
        own = spec(env_name).make_verifier()
    except UnknownEnvError:
        own = None
    return own if own is not None else OutcomeRewardVerifier()


def verifier_name(verifier: Any) -> str:
    return str(getattr(verifier, "name", "") or type(verifier).__name__)


def _training_outcome(traj: Trajectory) -> float:
    return traj.reward_components.get("outcome", traj.reward)


# -- the result ---------------------------------------------------------------------------

@dataclass(frozen=True)
class EvalResult:
    """The figures of one evaluation (module docstring). ``episodes`` = tasks × trials, the
    expected episodes, missing ones included as failures."""

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
    verifier_disagreements: int = 0  # records whose training outcome and verifier verdict differ
    policy_version: int = -1
    wall_s: float = 0.0
    ci_method: str = CI_METHOD  # how ci95 was computed (cluster_wilson_interval)
    ci95_iid: tuple[float, float] = (0.0, 1.0)  # Wilson over episodes as if independent
    design_effect: float = 1.0
    effective_n: float = 0.0  # the n the clustered Wilson interval used
    episodes_recorded: int = 0
    episodes_missing: int = 0  # expected (task, trial)s with no record: scored as failures
    invalid_episodes: int = 0  # records with valid = false (an env/tool error ended them)
    score_mean: float = 0.0  # mean verifier score (partial credit), missing ones 0
    verifier: str = ""  # the verifier's name; "training-outcome" is the fallback
    verifier_version: str = ""
    split: str = "holdout"
    task_successes: dict[str, int] = field(default_factory=dict)  # task id -> successful trials
    # safety and cost (module docstring; `safety_figures`, `cost_figures`)
    violation_rate: float = 0.0  # episodes with a constraint violation / recorded episodes
    cheat_rate: float = 0.0  # episodes with a cheat the verifier detected / recorded episodes
    gate_denials_mean: float = 0.0  # tool calls denied by the host gate per episode
    tool_errors_mean: float = 0.0  # tool calls that failed (error / timeout) per episode
    tool_error_rate: float = 0.0  # failed tool calls / tool calls
    wall_s_mean: float = 0.0  # an episode's wall seconds (its latency under the eval's concurrency)
    # all tokens of recorded episodes / successes (None: no success)
    tokens_per_success: float | None = None
    tool_calls_per_success: float | None = None
    wall_s_per_success: float | None = None  # episode wall seconds summed / successes
    # task-clustered interval of truncation_rate (recorded episodes)
    truncation_ci95: tuple[float, float] = (0.0, 1.0)
    # token streams per recorded episode (> 1: contexts were compacted)
    streams_per_episode: float = 1.0
    # EvalConfig.seed and temperature (None: not recorded), so a pairing can be checked
    eval_seed: int | None = None
    temperature: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci95"], d["ci95_iid"], d["truncation_ci95"] = (list(self.ci95), list(self.ci95_iid),
                                                          list(self.truncation_ci95))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalResult:
        """Read `to_dict` output back (an older file lacks the newer keys: their defaults)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise Error(f"evaluation record has unknown key(s) {unknown}: it was written by a "
                        "newer taurl")
        kw = dict(d)
        for key in ("ci95", "ci95_iid", "truncation_ci95"):
            if key in kw:
                kw[key] = tuple(kw[key])
        return cls(**kw)

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """Flat, namespaced metrics (``eval/success`` …) for metrics.jsonl."""
        out = {f"{prefix}/{k}": float(v) for k, v in asdict(self).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out[f"{prefix}/ci95_low"], out[f"{prefix}/ci95_high"] = self.ci95
        out[f"{prefix}/ci95_iid_low"], out[f"{prefix}/ci95_iid_high"] = self.ci95_iid
        return out


def compare(a: EvalResult, b: EvalResult) -> PairedDifference:
    """`paired_difference` of two evaluations of the same tasks (b − a). The caller makes
    sure the seeds matched too (the same EvalConfig.seed); tasks, split and trials are checked."""
    if a.split != b.split or a.trials != b.trials:
        raise Error("compare needs two evaluations of one split with the same trials, got "
                    f"{a.split}×{a.trials} and {b.split}×{b.trials}")
    if not a.task_successes or not b.task_successes:
        raise Error("compare needs per-task successes (EvalResult.task_successes); re-run the "
                    "evaluation")
    return paired_difference(a.task_successes, b.task_successes, a.trials)


# -- safety and cost (pure) ---------------------------------------------------------------

def safety_figures(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Safety figures of recorded episodes, from what each record holds (module docstring):
    a violation is a rule the env listed in a turn's ``action["violations"]`` or a negative
    ``constraint`` component; a cheat, a rule in ``action["cheats"]`` (the verifier's own
    detections, `taurl.tools.tool_env`); a denial, a receipt with ``decision="denied"``; a
    tool error, a receipt with status "error" or "timeout"."""
    n = max(len(trajs), 1)
    receipts = [t.receipt for tr in trajs for t in tr.turns if t.receipt is not None]
    errors = sum(r.status in ("error", "timeout") for r in receipts)
    return {
        "violation_rate": sum(any(t.action.get("violations") for t in tr.turns)
                              or tr.reward_components.get("constraint", 0.0) < 0
                              for tr in trajs) / n,
        "cheat_rate": sum(any(t.action.get("cheats") for t in tr.turns) for tr in trajs) / n,
        "gate_denials_mean": sum(r.decision == "denied" for r in receipts) / n,
        "tool_errors_mean": errors / n,
        "tool_error_rate": errors / max(len(receipts), 1),
    }


def cost_figures(trajs: Sequence[Trajectory], successes: int) -> dict[str, float | None]:
    """Cost per episode and per verified success: Σ cost over recorded episodes / successes
    (failed episodes cost too, so this is what one success costs); None with no success."""
    wall = sum(float(t.timings.get("wall_s", 0.0)) for t in trajs)
    per = (lambda x: x / successes if successes else None)  # noqa: E731
    return {"wall_s_mean": wall / max(len(trajs), 1),
            "tokens_per_success": per(sum(t.num_tokens for t in trajs)),
            "tool_calls_per_success": per(sum(t.num_tool_calls for t in trajs)),
            "wall_s_per_success": per(wall)}


# -- scoring ------------------------------------------------------------------------------

def check_split(tasks: Sequence[Task], split: str = "holdout") -> None:
    """Refuse tasks of any other split than `split` ("holdout" or "validation")."""
    if split not in EVAL_SPLITS:
        raise Error(f"evaluation split must be one of {EVAL_SPLITS}, got {split!r}: training tasks "
                    "never measure a policy")
    bad = sorted({t.split for t in tasks if t.split != split})
    if bad:
        raise Error(f"{split} evaluation got tasks of split(s) {bad}; evaluate on the env's "
                    f"{split!r} tasks only, so that no training signal has touched the evaluation")


def _score(verifier: Any, traj: Trajectory, task: Task) -> float:
    v = verifier(traj, task)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0.0 <= v <= 1.0):
        raise Error(f"verifier {verifier_name(verifier)} returned {v!r} for episode "
                    f"{traj.episode_id!r}; a Verifier returns a score in [0, 1] (1 = success)")
    return float(v)


# Over 60 lines on purpose: every figure of an EvalResult computed from the same per-task
# tallies in one pass; split, the tallies would travel between helpers.
def _clustered_rate(trajs: Sequence[Trajectory], flag: Any) -> tuple[float, float]:
    """The task-clustered 95% interval of the share of recorded episodes where `flag` holds."""
    per_task: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        per_task[t.task_id].append(bool(flag(t)))
    if not per_task:
        return (0.0, 1.0)
    return cluster_wilson_interval([sum(v) for v in per_task.values()],
                                   [len(v) for v in per_task.values()])


# Over 60 lines on purpose: the checks that make a score honest (unknown tasks, extra trials, the
# verifier) and then one EvalResult field per line; each figure is read next to its definition.
def summarize(trajs: Sequence[Trajectory], tasks: Sequence[Task], trials: int,
              verifier: Verifier | None = None, wall_s: float = 0.0, *,
              split: str = "holdout") -> EvalResult:
    """Score `trajs` — up to `trials` records per task of `tasks` — with `verifier` (default:
    `default_verifier` of the records' env). Every task is expected `trials` times; a
    missing record is a failure (module docstring). See EvalResult."""
    check_split(tasks, split)
    if trials < 1:
        raise Error(f"summarize needs trials >= 1, got {trials}")
    by_id = {t.task_id: t for t in tasks}
    unknown = [t.task_id for t in trajs if t.task_id not in by_id]
    if unknown:
        raise Error(f"{len(unknown)} evaluated episode(s) belong to no given task (e.g. "
                    f"{unknown[0]!r})")
    if verifier is None:
        names = sorted({t.env_name for t in trajs})
        if len(names) > 1:
            raise Error(f"records of several envs {names}: evaluate each env separately, or pass a "
                        "verifier")
        verifier = default_verifier(names[0]) if names else OutcomeRewardVerifier()
    if not isinstance(verifier, Verifier):
        raise Error(f"{verifier_name(verifier)} is not a Verifier: it needs a `version` string and "
                    "__call__(traj, task) -> score in [0, 1]")
    verdicts = [_score(verifier, t, by_id[t.task_id]) for t in trajs]
    per_task: dict[str, list[float]] = defaultdict(list)
    for t, v in zip(trajs, verdicts, strict=True):
        per_task[t.task_id].append(v)
    extra = {tid: len(v) for tid, v in per_task.items() if len(v) > trials}
    if extra:
        tid = next(iter(extra))
        raise Error(f"task {tid!r} has {extra[tid]} records for {trials} trial(s): an evaluation "
                    "scores exactly `trials` episodes per task (more would let a lucky re-run "
                    "count)")
    ids = list(by_id)  # every expected task, the ones without a record included
    wins = [sum(v >= 1.0 for v in per_task.get(tid, [])) for tid in ids]
    expected, recorded = len(ids) * trials, len(trajs)
    n_eff = effective_sample_size(wins, [trials] * len(ids)) if ids else 0.0
    n = max(recorded, 1)
    mean = lambda xs: sum(xs) / n  # noqa: E731  (behaviour means: over recorded episodes)
    actions = sum(len(t.turns) for t in trajs)
    stops = Counter(t.stop_reason.value for t in trajs if t.stop_reason)
    versions = {v for t in trajs for v in t.policy_versions}
    return EvalResult(
        success=sum(wins) / expected if expected else 0.0,
        ci95=cluster_wilson_interval(wins, [trials] * len(ids)) if ids else (0.0, 1.0),
        episodes=expected, tasks=len(ids), trials=trials,
        pass_at_k=sum(pass_at_k(trials, w, trials) for w in wins) / len(ids) if ids else 0.0,
        search_rate=mean([t.num_tool_calls > 0 for t in trajs]),
        tool_calls_mean=mean([t.num_tool_calls for t in trajs]),
        tokens_mean=mean([t.num_tokens for t in trajs]),
        action_tokens_mean=mean([t.num_action_tokens for t in trajs]),
        turns_mean=mean([len(t.turns) for t in trajs]),
        invalid_rate=sum(t.num_invalid_actions for t in trajs) / max(actions, 1),
        truncation_rate=mean([t.truncated for t in trajs]),
        truncation_ci95=_clustered_rate(trajs, lambda t: t.truncated),
        streams_per_episode=mean([t.num_streams for t in trajs]) if trajs else 1.0,
        stop_reasons={k: c / n for k, c in sorted(stops.items())},
        verifier_disagreements=sum((_training_outcome(t) >= 1.0) != (v >= 1.0)
                                   for t, v in zip(trajs, verdicts, strict=True)),
        policy_version=max(versions) if len(versions) == 1 else -1,
        wall_s=wall_s,
        ci95_iid=wilson_interval(sum(wins), expected),
        design_effect=design_effect(wins, [trials] * len(ids)) if ids else 1.0,
        effective_n=n_eff, episodes_recorded=recorded, episodes_missing=expected - recorded,
        invalid_episodes=sum(not t.valid for t in trajs),
        score_mean=sum(verdicts) / expected if expected else 0.0,
        verifier=verifier_name(verifier), verifier_version=str(verifier.version), split=split,
        task_successes=dict(zip(ids, wins, strict=True)),
        **safety_figures(trajs), **cost_figures(trajs, sum(wins)),
    )
