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

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from taurl.data.trajectory import Trajectory
from taurl.envs.core import Task
from taurl.envs.spec import Verifier
from taurl.errors import Error

Z95 = 1.96  # the normal 0.975 quantile used by every interval here
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

    def problems(self) -> list[str]:
        return [f"eval {k} must be >= 1 (got {getattr(self, k)})" for k in ("tasks", "trials", "concurrency")
                if getattr(self, k) < 1] + (["eval temperature must be >= 0"] if self.temperature < 0 else [])


# -- intervals (pure) ---------------------------------------------------------------------

def wilson_interval(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (Wilson 1927); (0, 1) if n = 0.

    centre (p̂ + z²/2n) / (1 + z²/n), half-width z·sqrt(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n).
    `n` may be an effective (non-integer) sample size, as `cluster_wilson_interval` uses it.

    >>> [round(x, 4) for x in wilson_interval(5, 10)]
    [0.2366, 0.7634]
    """
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / den
    # exact ends at p̂ = 0 and 1 (the formula gives them up to rounding)
    return (0.0 if p <= 0 else max(0.0, centre - half)), (1.0 if p >= 1 else min(1.0, centre + half))


def t_quantile(df: int, conf: float = 0.95) -> float:
    """Two-sided Student-t quantile: the t with P(|T_df| <= t) = conf.

    Exact for df <= 100: bisection on the closed-form |T| CDF for integer df (Abramowitz &
    Stegun 1964, 26.7.3 odd df / 26.7.4 even df); beyond, the Cornish–Fisher expansion
    (26.7.5, four terms; error < 1e-7 at df = 100).

    >>> [round(t_quantile(d), 4) for d in (1, 2, 9, 99)]
    [12.7062, 4.3027, 2.2622, 1.9842]
    """
    if df < 1:
        raise Error(f"t_quantile needs df >= 1, got {df}")
    if df > 100:
        z = Z95 if conf == 0.95 else _normal_quantile((1 + conf) / 2)
        g = [(z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96,
             (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
             (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160]
        return z + sum(gi / df ** (i + 1) for i, gi in enumerate(g))
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_abs_cdf(mid, df) < conf else (lo, mid)
    return (lo + hi) / 2


def _t_abs_cdf(t: float, df: int) -> float:
    """A(t|df) = P(|T| <= t), A&S 26.7.3 / 26.7.4 with θ = atan(t/√df)."""
    th = math.atan(t / math.sqrt(df))
    c2, total, term = math.cos(th) ** 2, 1.0, 1.0
    if df % 2:  # odd: (2/π)(θ + sinθ cosθ (1 + 2/3 cos²θ + … + 2·4…(df−3)/(1·3…(df−2)) cos^(df−3)θ))
        for k in range(1, (df - 1) // 2):
            term *= 2 * k / (2 * k + 1) * c2
            total += term
        return 2 / math.pi * (th + (math.sin(th) * math.cos(th) * total if df > 1 else 0.0))
    for k in range(1, df // 2):  # even: sinθ (1 + 1/2 cos²θ + … + 1·3…(df−3)/(2·4…(df−2)) cos^(df−2)θ)
        term *= (2 * k - 1) / (2 * k) * c2
        total += term
    return math.sin(th) * total


def _normal_quantile(q: float) -> float:
    lo, hi = -10.0, 10.0  # bisection on Φ(x) = (1 + erf(x/√2))/2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 + math.erf(mid / math.sqrt(2))) / 2 < q else (lo, mid)
    return (lo + hi) / 2


def design_effect(successes: Sequence[float], sizes: Sequence[int]) -> float:
    """Design effect of a task-clustered success rate (Kish 1965): its cluster-robust
    variance over the variance it would have if all N episodes were independent.

    With G tasks, task c with m_c trials and y_c successes, N = Σ m_c, p̂ = Σ y_c / N:

        v̂    = G/(G−1) · Σ_c (y_c − p̂·m_c)² / N²       cluster-robust (CR1) variance of p̂
        deff = v̂ / (p̂(1−p̂)/N), clamped to [1, Σ m_c² / N]

    v̂ is the sandwich variance of a ratio mean over clusters (Liang & Zeger 1986; for
    evals, Miller 2024, "Adding Error Bars to Evals", arXiv 2411.00640, §2 clustered
    standard errors). The clamp: never claim more information than N independent draws,
    nor less than one draw per task (Σ m_c²/N is the deff of perfectly correlated trials;
    m for equal sizes). When p̂ is 0 or 1 nothing is left to estimate the correlation from,
    and the upper end is taken (the conservative choice).

    >>> design_effect([10, 0, 10, 0], [10] * 4), design_effect([1, 1, 1, 1], [2] * 4)
    (10.0, 1.0)
    """
    if len(successes) != len(sizes) or not sizes:
        raise Error(f"design_effect needs one success count per task and at least one task "
                    f"(got {len(successes)} counts, {len(sizes)} sizes)")
    n, g = sum(sizes), len(sizes)
    if n <= 0:
        return 1.0
    p = sum(successes) / n
    upper = max(1.0, sum(m * m for m in sizes) / n)
    if g < 2 or p <= 0.0 or p >= 1.0:
        return upper
    v = g / (g - 1) * sum((y - p * m) ** 2 for y, m in zip(successes, sizes, strict=True)) / n**2
    return min(max(v / (p * (1 - p) / n), 1.0), upper)


def effective_sample_size(successes: Sequence[float], sizes: Sequence[int]) -> float:
    """n* = (N / deff) · (z / t_{G−1})²: the design-effect sample size with the degrees-of-
    freedom correction of Korn & Graubard 1998 ("Confidence intervals for proportions with
    small expected number of positive counts estimated from survey data", Survey
    Methodology 24(2):193–201), df = G − 1 tasks; 0 with fewer than two tasks."""
    g = len(sizes)
    if g < 2:
        return 0.0
    return sum(sizes) / design_effect(successes, sizes) * (Z95 / t_quantile(g - 1)) ** 2


def cluster_wilson_interval(successes: Sequence[float], sizes: Sequence[int]) -> tuple[float, float]:
    """Task-clustered 95% interval of a success rate: the Wilson interval (Wilson 1927) at
    p̂ = Σ y_c / Σ m_c with n = `effective_sample_size` (design effect + Korn–Graubard df).

    Trials of one task are correlated (the same question, the same policy), so 100 tasks ×
    3 trials carry less than 300 draws of information; Wilson at the effective n is the
    clustered-survey interval Dean & Pagano 2015 found to keep coverage near nominal
    (J. Survey Statistics and Methodology 3(4):484–503). It stays sane at p̂ = 0 or 1 and
    with few tasks, where a task-level percentile bootstrap collapses to a point or
    under-covers. A check here (beta-binomial tasks, 3 trials, ICC 0–0.7, p 0.1–0.8):
    coverage 0.96–0.99 with 10 tasks, 0.94–0.97 with 30 and 100; the i.i.d. Wilson 0.76–0.97
    and the percentile bootstrap 0.76–0.95 with 10 tasks. (0, 1) with fewer than two tasks.

    Ten tasks of ten trials, five all-success and five all-failure: deff = 10, n* = 10 ·
    (1.96/2.2622)² = 7.507, the interval of 7.5 independent draws, not of 100:

    >>> [round(x, 3) for x in cluster_wilson_interval([10] * 5 + [0] * 5, [10] * 10)]
    [0.209, 0.791]
    """
    n_eff = effective_sample_size(successes, sizes)
    if n_eff <= 0:
        return 0.0, 1.0
    return wilson_interval(sum(successes) / sum(sizes) * n_eff, n_eff)


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


@dataclass(frozen=True)
class PairedDifference:
    """Success of B minus success of A on the same tasks (and seeds), task-clustered."""

    difference: float
    ci95: tuple[float, float]
    tasks: int
    trials: int
    a_success: float
    b_success: float
    ci_method: str = "paired-task-t"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ci95": list(self.ci95)}


def paired_difference(a: Mapping[str, float], b: Mapping[str, float], trials: int) -> PairedDifference:
    """B − A from per-task success counts (task id → successes of `trials` trials).

    The task is the unit (its trials averaged), and the two evaluations are paired by task:
    d_c = (y_c^B − y_c^A)/m, d̄ = mean_c d_c, s² = Σ_c (d_c − d̄)²/(G−1), and the interval
    d̄ ± t_{G−1} · s/√G (Student's paired t over tasks; Miller 2024, arXiv 2411.00640, §4
    paired differences, with §2's clustering by question), clipped to [−1, 1]. Pairing
    removes the task-difficulty variance both evaluations share, so it is narrower than two
    separate intervals. Every task differing by the same amount gives a zero-width interval
    (no spread to estimate a variance from); fewer than two tasks give (−1, 1). A check here
    (beta-binomial task difficulty, ICC 0.3–0.7, 3 trials, B lifting every task's rate by
    0–0.3 of its headroom): coverage 0.94–0.98 with 10, 30 and 100 tasks.

    d = [.5, .5, 0, .5]: d̄ = .375, s² = .1875/3, s/√4 = .125, t_3 = 3.1824, half .3978:

    >>> r = paired_difference({"a": 0, "b": 1, "c": 1, "d": 0}, {"a": 1, "b": 2, "c": 1, "d": 1}, trials=2)
    >>> round(r.difference, 4), [round(x, 4) for x in r.ci95]
    (0.375, [-0.0228, 0.7728])
    """
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))
        raise Error(f"a paired comparison needs the same tasks in both evaluations; {len(only)} task(s) are in "
                    f"one only (e.g. {only[0]!r}): evaluate both on the same tasks and seeds")
    if trials < 1:
        raise Error(f"paired_difference needs trials >= 1, got {trials}")
    ids = sorted(a)
    d = [(b[t] - a[t]) / trials for t in ids]
    g = len(d)
    mean = sum(d) / g if g else 0.0
    sa, sb = (sum(x.values()) / (g * trials) if g else 0.0 for x in (a, b))
    if g < 2:
        return PairedDifference(mean, (-1.0, 1.0), g, trials, sa, sb)
    half = t_quantile(g - 1) * math.sqrt(sum((x - mean) ** 2 for x in d) / (g - 1) / g)
    return PairedDifference(mean, (max(-1.0, mean - half), min(1.0, mean + half)), g, trials, sa, sb)


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
    tokens_per_success: float | None = None  # all tokens of recorded episodes / successes (None: no success)
    tool_calls_per_success: float | None = None
    wall_s_per_success: float | None = None  # episode wall seconds summed / successes
    eval_seed: int | None = None  # EvalConfig.seed and temperature (None: not recorded), so a pairing can be checked
    temperature: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci95"], d["ci95_iid"] = list(self.ci95), list(self.ci95_iid)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalResult:
        """Read `to_dict` output back (an older file lacks the newer keys: their defaults)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise Error(f"evaluation record has unknown key(s) {unknown}: it was written by a newer taurl")
        kw = dict(d)
        for key in ("ci95", "ci95_iid"):
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
        raise Error(f"compare needs two evaluations of one split with the same trials, got {a.split}×{a.trials} "
                    f"and {b.split}×{b.trials}")
    if not a.task_successes or not b.task_successes:
        raise Error("compare needs per-task successes (EvalResult.task_successes); re-run the evaluation")
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
                              or tr.reward_components.get("constraint", 0.0) < 0 for tr in trajs) / n,
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
        raise Error(f"evaluation split must be one of {EVAL_SPLITS}, got {split!r}: training tasks never "
                    "measure a policy")
    bad = sorted({t.split for t in tasks if t.split != split})
    if bad:
        raise Error(f"{split} evaluation got tasks of split(s) {bad}; evaluate on the env's {split!r} tasks "
                    f"only, so that no training signal has touched the evaluation")


def _score(verifier: Any, traj: Trajectory, task: Task) -> float:
    v = verifier(traj, task)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0.0 <= v <= 1.0):
        raise Error(f"verifier {verifier_name(verifier)} returned {v!r} for episode {traj.episode_id!r}; "
                    "a Verifier returns a score in [0, 1] (1 = success)")
    return float(v)


def summarize(trajs: Sequence[Trajectory], tasks: Sequence[Task], trials: int,
              verifier: Verifier | None = None, wall_s: float = 0.0, *, split: str = "holdout") -> EvalResult:
    """Score `trajs` — up to `trials` records per task of `tasks` — with `verifier` (default:
    `default_verifier` of the records' env). Every task is expected `trials` times; a
    missing record is a failure (module docstring). See EvalResult."""
    check_split(tasks, split)
    if trials < 1:
        raise Error(f"summarize needs trials >= 1, got {trials}")
    by_id = {t.task_id: t for t in tasks}
    unknown = [t.task_id for t in trajs if t.task_id not in by_id]
    if unknown:
        raise Error(f"{len(unknown)} evaluated episode(s) belong to no given task (e.g. {unknown[0]!r})")
    if verifier is None:
        names = sorted({t.env_name for t in trajs})
        if len(names) > 1:
            raise Error(f"records of several envs {names}: evaluate each env separately, or pass a verifier")
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
        raise Error(f"task {tid!r} has {extra[tid]} records for {trials} trial(s): an evaluation scores exactly "
                    "`trials` episodes per task (more would let a lucky re-run count)")
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
