"""Health alarms over the RL updates' metric rows (pure functions; one check per update).

RAGEN (Wang et al. 2025, arXiv:2504.20073, §4 "Echo Trap") describes the way multi-turn
agent RL collapses: the reward variance within groups vanishes, the entropy falls, the
gradient norm spikes and the policy repeats one answer. Each of these signals is already
in the per-update row of `metrics.jsonl` (built in `taurl.recipe.loop._rl_loop`); the alarms
watch them. Every alarm is a predicate over the history of rows up to the current one:

| alarm | fires when (defaults in `AlarmConfig`) |
|---|---|
| reward_std_collapse | `rollout/reward_std` <= reward_std_min for `consecutive` updates in a row |
| same_reward_groups | `rollout/groups_same_reward` >= same_reward_max for `consecutive` updates in
a row | | entropy_collapse | `learn/entropy` < entropy_floor, or < entropy_drop × the running
median, for `consecutive` updates | | entropy_spike | `learn/entropy` > entropy_spike × the running
median | | grad_norm_spike | `learn/grad_norm` > grad_norm_spike × the running median (updates that
took a step) | | invalid_rate_rising | mean `rollout/invalid_rate` of the last rise_window updates −
that of the first rise_window > invalid_rise | | truncation_rate_rising | the same for
`rollout/truncation_rate` and truncation_rise | | staleness | `rollout/staleness_max` >
staleness_eta (inactive where a row has no staleness metric) | | logprob_drift | `mismatch/abs_mean`
> drift_abs_mean or `mismatch/abs_max` > drift_abs_max |
| logprob_drift, bf16/fp16 on either side | drift_abs_mean_low, drift_abs_max_low (`drift_bounds`) |

The running median is the median of the previous `window` rows (at least `min_history`
of them, otherwise the relative alarms stay silent: there is no baseline yet). The
median, not the mean, so one earlier spike does not hide the next one.

Each alarm that fires gives a warning log line, a metric ``alarm/<name>`` (1 firing,
0 not) in the row, a line in the report's "Health alarms" section, and, when its name is
in ``stop_on``, the end of RL (the run still evaluates and reports; see the recipe).
"""

from __future__ import annotations

import dataclasses
import difflib
import statistics
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from taurl.data.staleness import staleness_stats

Row = dict[str, Any]

ALARMS: dict[str, str] = {
    "reward_std_collapse": "the rollouts' reward std stayed near 0: the reward no longer tells "
                           "episodes apart",
    "same_reward_groups": "most groups got identical rewards for several updates: GRPO has no "
                          "signal (Echo Trap)",
    "entropy_collapse": "the policy's entropy collapsed: it samples one answer and stops exploring",
    "entropy_spike": "the policy's entropy jumped far above its running median: the policy is "
                     "breaking up",
    "grad_norm_spike": "the gradient norm jumped far above its running median (before clipping)",
    "invalid_rate_rising": "the share of invalid actions rose well above the run's start",
    "truncation_rate_rising": "the share of episodes cut by a budget rose well above the run's "
                              "start",
    "staleness": "episodes older than the staleness bound η were trained on",
    "logprob_drift": "the learner's logprobs differ from the engine's behaviour logprobs on the "
                     "same weights",
}


@dataclass(frozen=True)
class AlarmConfig:
    """The `alarms:` option of a training config (every key optional)."""

    enabled: bool = True  # false: no alarm is checked
    disable: list[str] = field(default_factory=list)  # alarms not checked (names in ALARMS)
    stop_on: list[str] = field(default_factory=list)  # alarms that end RL when they fire
    consecutive: int = 3  # k: updates in a row a persistent alarm's condition must hold
    window: int = 10  # rows of the running median
    min_history: int = 5  # rows needed before a relative (median-based) alarm may fire
    rise_window: int = 5  # rows averaged at the start and at the end for the *_rising alarms
    reward_std_min: float = 0.01
    same_reward_max: float = 0.9
    entropy_floor: float = 0.01  # nats per action token
    entropy_drop: float = 0.1
    entropy_spike: float = 5.0
    grad_norm_spike: float = 5.0
    invalid_rise: float = 0.15
    truncation_rise: float = 0.15
    staleness_eta: int = 0  # the sync loop is on-policy (η = 0)
    drift_abs_mean: float = 1e-3  # the same bounds as taurl.train.mismatch.Mismatch.alarms
    drift_abs_max: float = 1e-2
    # the same where the learner computes in bf16/fp16 or the engine samples in bf16
    # (`drift_bounds`): that rounding alone is ~1e-3 mean, far above the fp32 bounds
    drift_abs_mean_low: float = 0.1
    drift_abs_max_low: float = 1.0
    # set by the run from train.precision / policy.torch_dtype (`low_precision`), not an option
    low_precision: bool = False

    def active(self) -> list[str]:
        return [n for n in ALARMS if self.enabled and n not in self.disable]

    def drift_bounds(self) -> tuple[float, float]:
        """(mean, max) bounds of |learner − behaviour logprob| for this run's numerics.

        fp32 on both sides: 1e-3 / 1e-2, three orders of magnitude over what fp32 gives
        (mean 7e-7 on the demo, 30 updates). bf16 on either side (train.precision bf16-mixed
        or fp16-mixed, or policy.torch_dtype bfloat16): bf16 keeps 8 significant bits to
        fp32's 24, and its mismatch was measured at mean 3.5e-4–3.9e-3 (median 1.25e-3)
        and max 0.02–0.19 per update on the demo (30 updates), mean 0.028 and max 0.31 on
        SmolLM2-135M (2 updates); the fp32 bounds fired on every one of those updates. The
        low bounds, 0.1 / 1.0, sit ~3x over the largest of those, so the alarm still fires
        on a real drift (weights the engine never loaded, a wrong template) that moves log π
        by tenths. fp16-mixed (11 bits) was not measured; it gets the bf16 bounds.
        """
        if self.low_precision:
            return self.drift_abs_mean_low, self.drift_abs_max_low
        return self.drift_abs_mean, self.drift_abs_max


def low_precision(precision: str = "fp32", torch_dtype: str = "float32") -> bool:
    """Whether a run's learner or engine rounds to bf16/fp16 (`AlarmConfig.drift_bounds`)."""
    return precision != "fp32" or torch_dtype != "float32"


_AT_LEAST_ONE = ("consecutive", "window", "min_history", "rise_window")
_SET_BY_THE_RUN = ("low_precision",)  # fields no `alarms:` option sets


def alarm_config(options: dict[str, Any]) -> tuple[AlarmConfig, list[str]]:
    """The `AlarmConfig` of `options` and every problem with them (unknown keys get a
    "did you mean", wrong types and ranges are named); on problems, the defaults."""
    fields = {f.name: f for f in dataclasses.fields(AlarmConfig)
              if f.name not in _SET_BY_THE_RUN}
    hints = typing.get_type_hints(AlarmConfig)
    problems: list[str] = []
    good: dict[str, Any] = {}
    for key, value in options.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            problems.append(f"alarms: unknown option {key!r}" + (f"; did you mean {close[0]!r}?"
                                                                 if close else ""))
            continue
        hint = hints[key]
        ok = (isinstance(value, bool) if hint is bool else
              isinstance(value, list) and all(isinstance(v, str) for v in value)
              if typing.get_origin(hint) is list
              else isinstance(value, int) and not isinstance(value, bool) if hint is int
              else isinstance(value, (int, float)) and not isinstance(value, bool))
        if not ok:
            kind = {"bool": "true or false", "int": "an integer", "float": "a number"}.get(
                getattr(hint, "__name__", ""), "a list of alarm names")
            problems.append(f"alarms: {key} must be {kind} (got {value!r})")
            continue
        if typing.get_origin(hint) is list:
            for name in value:
                if name not in ALARMS:
                    close = difflib.get_close_matches(name, ALARMS, n=1)
                    problems.append(f"alarms: {key}: no alarm named {name!r}"
                                    + (f"; did you mean {close[0]!r}?" if close
                                       else f" (alarms: {', '.join(ALARMS)})"))
        elif hint is not bool and value < (least := 1 if key in _AT_LEAST_ONE else 0):
            problems.append(f"alarms: {key} must be >= {least} (got {value})")
        good[key] = value
    if problems:
        return AlarmConfig(), problems
    return AlarmConfig(**good), []


# ---------------------------------------------------------------------------------------
# One predicate per alarm: (rows up to now, config) -> a sentence when it holds, else None


def _median_before(rows: Sequence[Row], key: str, cfg: AlarmConfig,
                   keep: Callable[[Row], bool] = lambda r: True):
    """Median of `key` over the `window` rows before the last (None below min_history)."""
    prev = [r[key] for r in rows[:-1] if key in r and keep(r)][-cfg.window:]
    return statistics.median(prev) if len(prev) >= cfg.min_history else None


def _reward_std(rows: Sequence[Row], cfg: AlarmConfig) -> str | None:
    v = rows[-1].get("rollout/reward_std")
    return (None if v is None or v > cfg.reward_std_min
            else f"reward std {v:.4f} <= {cfg.reward_std_min:g}")


def _same_groups(rows: Sequence[Row], cfg: AlarmConfig) -> str | None:
    v = rows[-1].get("rollout/groups_same_reward")
    return (None if v is None or v < cfg.same_reward_max
            else f"{v:.0%} of groups have identical rewards (>= {cfg.same_reward_max:.0%})")


def _entropy_collapse(rows: Sequence[Row], cfg: AlarmConfig) -> str | None:
    v = rows[-1].get("learn/entropy")
    if v is None:
        return None
    if v < cfg.entropy_floor:
        return f"entropy {v:.4f} < floor {cfg.entropy_floor:g}"
    med = _median_before(rows, "learn/entropy", cfg)
    if med is not None and v < cfg.entropy_drop * med:
        return f"entropy {v:.4f} < {cfg.entropy_drop:g} × running median {med:.4f}"
    return None


def _entropy_spike(rows: Sequence[Row], cfg: AlarmConfig) -> str | None:
    v, med = rows[-1].get("learn/entropy"), _median_before(rows, "learn/entropy", cfg)
    return (f"entropy {v:.4f} > {cfg.entropy_spike:g} × running median {med:.4f}"
            if v is not None and med is not None and v > cfg.entropy_spike * med else None)


def _grad_spike(rows: Sequence[Row], cfg: AlarmConfig) -> str | None:
    def stepped(r: Row) -> bool:  # an update that took no step reports a gradient norm of 0
        return not r.get("learn/skipped")

    v = rows[-1].get("learn/grad_norm")
    if v is None or not stepped(rows[-1]):
        return None
    med = _median_before(rows, "learn/grad_norm", cfg, stepped)
    return (f"gradient norm {v:.3f} > {cfg.grad_norm_spike:g} × running median {med:.3f}"
            if med is not None and v > cfg.grad_norm_spike * med else None)


def _rising(key: str, limit: Callable[[AlarmConfig], float]):
    def check(rows: Sequence[Row], cfg: AlarmConfig) -> str | None:
        vals = [r[key] for r in rows if key in r]
        w = cfg.rise_window
        if len(vals) < 2 * w or key not in rows[-1]:
            return None
        start, now = sum(vals[:w]) / w, sum(vals[-w:]) / w
        return (f"{key} mean of the last {w} updates {now:.3f} > first {w} {start:.3f} + "
                f"{limit(cfg):g}"
                if now - start > limit(cfg) else None)
    return check


def _staleness(rows: Sequence[Row], cfg: AlarmConfig) -> str | None:
    v = rows[-1].get("rollout/staleness_max")
    return (f"staleness {v:g} versions > η = {cfg.staleness_eta}" if v is not None
            and v > cfg.staleness_eta else None)


def _drift(rows: Sequence[Row], cfg: AlarmConfig) -> str | None:
    r = rows[-1]
    if not r.get("mismatch/tokens"):
        return None
    out, (mean, most) = [], cfg.drift_bounds()
    if r.get("mismatch/abs_mean", 0.0) > mean:
        out.append(f"|Δ logprob| mean {r['mismatch/abs_mean']:.2e} > {mean:g}")
    if r.get("mismatch/abs_max", 0.0) > most:
        out.append(f"|Δ logprob| max {r['mismatch/abs_max']:.2e} > {most:g}")
    return "; ".join(out) or None


CHECKS: dict[str, Callable[[Sequence[Row], AlarmConfig], str | None]] = {
    "reward_std_collapse": _reward_std, "same_reward_groups": _same_groups,
    "entropy_collapse": _entropy_collapse,
    "entropy_spike": _entropy_spike, "grad_norm_spike": _grad_spike,
    "invalid_rate_rising": _rising("rollout/invalid_rate", lambda c: c.invalid_rise),
    "truncation_rate_rising": _rising("rollout/truncation_rate", lambda c: c.truncation_rise),
    "staleness": _staleness, "logprob_drift": _drift,
}
# need `consecutive` rows
PERSISTENT = {"reward_std_collapse", "same_reward_groups", "entropy_collapse"}


@dataclass(frozen=True)
class Alarm:
    name: str
    update: int
    message: str

    def line(self) -> str:
        return f"ALARM {self.name} at update {self.update}: {self.message} — {ALARMS[self.name]}"


def check(rows: Sequence[Row], cfg: AlarmConfig) -> list[Alarm]:
    """The alarms firing at the last of `rows` (the RL rows so far, in update order)."""
    if not rows:
        return []
    out = []
    for name in cfg.active():
        k = cfg.consecutive if name in PERSISTENT else 1
        if len(rows) < k:
            continue
        said = [CHECKS[name](rows[: len(rows) - j], cfg) for j in range(k)]
        if all(said):
            out.append(Alarm(name, int(rows[-1].get("update", len(rows))), said[0]))
    return out


def alarm_metrics(fired: Sequence[Alarm], cfg: AlarmConfig) -> dict[str, float]:
    """``alarm/<name>``: 1.0 for each firing alarm, 0.0 for each other checked one."""
    names = {a.name for a in fired}
    return {f"alarm/{n}": float(n in names) for n in cfg.active()}


def rl_rows(rows: Sequence[Row]) -> list[Row]:
    """The RL rows of a metrics.jsonl, one per update (a resumed run's later row wins)."""
    last = {r["update"]: r for r in rows if r.get("phase") == "rl" and "update" in r}
    return [last[u] for u in sorted(last)]


def scan(rows: Sequence[Row], cfg: AlarmConfig) -> list[Alarm]:
    """Every alarm at every update of a run's metric rows (what the report lists)."""
    rl = rl_rows(rows)
    return [a for i in range(1, len(rl) + 1) for a in check(rl[:i], cfg)]


def staleness_max(trajs: Sequence[Any], version: int) -> float:
    """Largest `version` − (oldest policy version in an episode): how stale the batch is
    (`taurl.data.staleness`, the one definition of an episode's age)."""
    return staleness_stats(trajs, version).max


__all__ = ["ALARMS", "Alarm", "AlarmConfig", "alarm_config", "alarm_metrics", "check", "rl_rows",
           "scan", "staleness_max", "low_precision"]


class Watch:
    """The alarms of one RL loop: remembers the rows, logs each firing, says when to stop."""

    def __init__(self, options: dict[str, Any], earlier_rows: Sequence[Row] = (), log: Any = None,
                 low: bool = False):
        import logging

        # validated with the run's config before any work; low: `low_precision` of the run
        self.cfg = dataclasses.replace(alarm_config(options)[0], low_precision=low)
        self.rows = rl_rows(earlier_rows)  # a resumed run keeps its history
        self.log = log or logging.getLogger("taurl.alarms")

    def observe(self, row: Row) -> list[Alarm]:
        """Check `row` (this update's) against the history; adds ``alarm/*`` to it."""
        self.rows = [r for r in self.rows if r.get("update") != row.get("update")] + [row]
        fired = check(self.rows, self.cfg)
        row.update(alarm_metrics(fired, self.cfg))
        for a in fired:
            self.log.warning(a.line())
        return fired

    def stops(self, fired: Sequence[Alarm]) -> list[str]:
        """The names among `fired` that end RL (``stop_on``)."""
        return [a.name for a in fired if a.name in self.cfg.stop_on]
