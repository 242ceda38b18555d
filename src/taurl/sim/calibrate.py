"""Calibrate a simulated `Workload` from a real synchronous run (issue 11 item 5's check).

Pure functions over what a run records — its ledger's episodes, its metrics rows, its
config — and a decode probe's timings; `benchmarks/_sim_check.py` reads the run, runs the
probe and compares the simulator's prediction with the real async run's measurement.

Each `Workload` field and where it comes from (`calibrate`):

* generated tokens per episode (Σ action tokens): log-normal, median = exp(mean ln L),
  σ = population std of ln L (the maximum-likelihood fit, `fit_lognormal`); budget =
  the run's ``max_episode_tokens``;
* turns: the simulator draws T ~ Uniform{1..M} (T − 1 tool calls), made single-turn first
  with probability p (``single_turn_prob``). Given the share f of episodes with ≥ 1 tool
  call and their mean number of calls m: among multi-turn episodes the calls are
  Uniform{1..M − 1}, mean M/2, so M = max(2, round(2m)); and f = (1 − p)(M − 1)/M, so
  p = 1 − f·M/(M − 1) (`fit_turns`);
* tool latency: the real wrapper (`taurl.recipe.schedule.latency.ToolLatency`) waits
  min(max_s, LogNormal(μ, σ)) with μ = ln(mean) − σ²/2 after every tool call, failed or
  not; the simulator's median is exp(μ), its σ the same, its timeout max_s, and no fast
  failures (`sim_tool_latency`);
* decode step a + b·n: least squares over a probe's (mean batch, wall s per step) points
  (`fit_line`); prefill is folded into the steps the probe times;
* learner: learn_s = fixed + per_token · tokens of the batch (prompt + actions +
  observations, what `EpisodePlan.total_tokens` counts), least squares over the run's
  updates (`fit_line`);
* weight sync: the mean of the sync run's ``time/checkpoint_s`` (save + engine load);
* batch shape from the config; concurrency from the schedule simulated.

`fit_line` keeps both coefficients ≥ 0 (a negative fixed cost or slope is noise on a few
points, not a cost): when the unconstrained fit has one negative, that one is set to 0
and the other refitted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from taurl.errors import Error
from taurl.sim.workload import Workload


def fit_lognormal(values: Sequence[float]) -> tuple[float, float]:
    """(median, σ) of a log-normal fitted by maximum likelihood: exp(mean ln x), std(ln x).

    >>> fit_lognormal([1.0, math.e ** 2])
    (2.718281828459045, 1.0)
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0 or (x <= 0).any():
        raise Error(f"fit_lognormal needs values > 0, got {x.size} values (min "
                    f"{x.min() if x.size else None})")
    ln = np.log(x)
    return float(np.exp(ln.mean())), float(ln.std())


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(a, b) ≥ 0 minimising Σ (y − a − b·x)² (module docstring: the constraint).

    >>> fit_line([1, 2, 3], [3, 5, 7])
    (1.0, 2.0)
    >>> fit_line([1, 2, 3], [3, 3, 3])
    (3.0, 0.0)
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.size == 0 or xs.size != ys.size:
        raise Error(f"fit_line needs as many x as y values (and some): {xs.size} vs {ys.size}")
    if xs.size >= 2 and np.ptp(xs) > 0:
        b, a = np.polyfit(xs, ys, 1)
        if a >= 0 and b >= 0:
            return round(float(a), 12), round(float(b), 12)
        if b < 0:  # no positive slope in the data: a constant
            return max(0.0, float(ys.mean())), 0.0
    # through the origin (a negative intercept, or one distinct x)
    sxx = float((xs * xs).sum())
    return 0.0, max(0.0, float((xs * ys).sum() / sxx)) if sxx > 0 else 0.0


def sim_tool_latency(mean_s: float, sigma: float, max_s: float) -> tuple[float, float, float]:
    """The simulator's (tool_median_s, tool_sigma, tool_timeout_s) for `ToolLatency(mean_s, sigma,
    max_s)`: the median of LogNormal(ln mean − σ²/2, σ) is mean·exp(−σ²/2).

    >>> sim_tool_latency(1.0, 1.0, 5.0)
    (0.6065306597126334, 1.0, 5.0)
    """
    if mean_s <= 0:
        return 0.0, sigma, max_s
    return mean_s * math.exp(-sigma ** 2 / 2), sigma, max_s


def fit_turns(tool_calls: Sequence[int]) -> tuple[int, float]:
    """(max_turns M, single_turn_prob p) matching the share of episodes that call a tool and
    their mean number of calls (module docstring). A share above (M − 1)/M cannot be reached
    with p ≥ 0; p is then 0 (the simulator calls tools less often than the data).

    >>> fit_turns([0, 0, 0, 1])   # a quarter call once: M = 2, (1 − p)/2 = 1/4
    (2, 0.5)
    """
    c = np.asarray(tool_calls, dtype=float)
    if c.size == 0:
        raise Error("fit_turns needs at least one episode")
    callers = c[c >= 1]
    if callers.size == 0:
        return 1, 0.0
    m = max(2, round(2 * float(callers.mean())))
    share = callers.size / c.size
    return int(m), float(min(1.0, max(0.0, 1 - share * m / (m - 1))))


@dataclass(frozen=True)
class SyncObservations:
    """What a real synchronous run recorded (read by `benchmarks/_sim_check.py`)."""

    action_tokens: tuple[int, ...]  # Σ action tokens of each RL episode (ledger, split train)
    tool_calls: tuple[int, ...]  # tool calls (turns with a receipt) of each RL episode
    prompt_tokens: float  # mean prompt tokens of an episode
    obs_tokens: float  # mean tokens of one observation
    learn_s: tuple[float, ...]  # time/learn_s of each update
    # tokens of each update's batch (prompt + actions + observations)
    learn_tokens: tuple[float, ...]
    # time/checkpoint_s of each update: checkpoint written + engine loaded
    sync_s: tuple[float, ...]
    tasks_per_batch: int
    group_size: int
    max_episode_tokens: int
    latency_mean_s: float  # ToolLatency's parameters (env_config latency_*)
    latency_sigma: float
    latency_max_s: float


@dataclass(frozen=True)
class DecodeProbe:
    """Timings of a short engine probe: wall seconds per decode step at several batch sizes."""

    batch: tuple[float, ...]  # mean sequences per decode step of each probe point
    step_s: tuple[float, ...]  # wall seconds per decode step of each point (prefill included)
    prefill_s_per_token: float  # wall seconds per prompt token of a batched prefill


@dataclass(frozen=True)
class Calibration:
    workload: Workload
    tool_call_share: float  # measured share of episodes with >= 1 tool call
    sim_tool_call_share: float  # the calibrated workload's: (1 − p)(M − 1)/M
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return {"workload": asdict(self.workload), "tool_call_share": self.tool_call_share,
                "sim_tool_call_share": self.sim_tool_call_share, "notes": list(self.notes)}


def calibrate(obs: SyncObservations, probe: DecodeProbe, max_concurrent: int) -> Calibration:
    """The `Workload` of a synchronous run (module docstring: each field's source)."""
    median, sigma = fit_lognormal([max(1, n) for n in obs.action_tokens])
    turns, p = fit_turns(obs.tool_calls)
    tool_median, tool_sigma, timeout = sim_tool_latency(obs.latency_mean_s, obs.latency_sigma,
                                                        obs.latency_max_s)
    a, b = fit_line(probe.batch, probe.step_s)
    fixed, per_token = fit_line(obs.learn_tokens, obs.learn_s)
    share = sum(1 for c in obs.tool_calls if c >= 1) / len(obs.tool_calls)
    sim_share = (1 - p) * (turns - 1) / turns
    notes = []
    if abs(sim_share - share) > 0.01:
        notes.append(f"tool-call share {share:.3f} not reachable with max_turns {turns}: simulated "
                     f"{sim_share:.3f}")
    w = Workload(
        tasks_per_batch=obs.tasks_per_batch, group_size=obs.group_size,
        gen_median_tokens=max(1.0, median),
        gen_sigma=sigma, max_gen_tokens=obs.max_episode_tokens, max_turns=turns, single_turn_prob=p,
        prompt_tokens=round(obs.prompt_tokens), obs_tokens=round(obs.obs_tokens),
        tool_median_s=tool_median,
        tool_sigma=tool_sigma, tool_fail_prob=0.0, tool_timeout_s=timeout, decode_a_s=a,
        decode_b_s=b,
        max_concurrent=max_concurrent, sync_s=float(np.mean(obs.sync_s)) if obs.sync_s else 0.0,
        reprefill_s_per_token=probe.prefill_s_per_token, learn_fixed_s=fixed,
        learn_s_per_token=per_token)
    return Calibration(w.check(), share, sim_share, notes)
