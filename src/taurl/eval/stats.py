"""The statistics of an evaluation: intervals, design effects, pass@k, paired differences.

Pure functions over counts. An evaluation's episodes are clustered (k trials of one task are
not independent draws), so the success rate's interval is a Wilson interval on the
effective sample size (`cluster_wilson_interval`), and two policies evaluated on the same
tasks are compared task by task (`paired_difference`, a t interval on the per-task
differences).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from taurl.errors import Error

Z95 = 1.96  # the normal 0.975 quantile used by every interval here


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
    return (0.0 if p <= 0 else max(0.0, centre - half)), (1.0 if p >= 1
                                                          else min(1.0, centre + half))


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
    if df % 2:
        # odd: (2/π)(θ + sinθ cosθ (1 + 2/3 cos²θ + … + 2·4…(df−3)/(1·3…(df−2)) cos^(df−3)θ))
        for k in range(1, (df - 1) // 2):
            term *= 2 * k / (2 * k + 1) * c2
            total += term
        return 2 / math.pi * (th + (math.sin(th) * math.cos(th) * total if df > 1 else 0.0))
    for k in range(1, df // 2):
        # even: sinθ (1 + 1/2 cos²θ + … + 1·3…(df−3)/(2·4…(df−2)) cos^(df−2)θ)
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


def cluster_wilson_interval(successes: Sequence[float],
                            sizes: Sequence[int]) -> tuple[float, float]:
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


def paired_difference(a: Mapping[str, float], b: Mapping[str, float],
                      trials: int) -> PairedDifference:
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

    >>> r = paired_difference({"a": 0, "b": 1, "c": 1, "d": 0}, {"a": 1, "b": 2, "c": 1, "d": 1},
    ...                       trials=2)
    >>> round(r.difference, 4), [round(x, 4) for x in r.ci95]
    (0.375, [-0.0228, 0.7728])
    """
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))
        raise Error(
            f"a paired comparison needs the same tasks in both evaluations; {len(only)} "
            f"task(s) are in one only (e.g. {only[0]!r}): evaluate both on the same tasks "
            "and seeds"
        )
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
    return PairedDifference(
        mean, (max(-1.0, mean - half), min(1.0, mean + half)), g, trials, sa, sb
    )
