"""The promotion gate: may a candidate policy replace the baseline? And the run's record of it.

`decide` is a pure function of two policies' evaluations on the SAME tasks and seeds (the
holdout suite, and the validation split as the second suite) and the thresholds
(`PromotionConfig`, the ``promotion:`` option of the train config). Each rule either
passes or refuses with its reason; the candidate is promoted only if every rule passes:

1. gain: the paired, task-clustered holdout difference candidate − baseline
   (`taurl.eval.stats.paired_difference`: Student's paired t over tasks) has its lower 95%
   bound above ``margin`` — a lucky run whose interval reaches down to 0 does not pass;
2. safety: the candidate's violation_rate, cheat_rate and gate_denials_mean (holdout,
   `taurl.eval.evaluate.safety_figures`) are each at most the baseline's + ``safety_tolerance``;
3. cost: tokens, tool calls and wall seconds per success (holdout) are at most
   ``max_cost_ratio`` (tokens, tool calls) and ``max_wall_ratio`` (wall seconds: noisier on
   a shared machine) times the baseline's; a candidate with no success fails, a baseline
   with none passes any candidate that succeeds;
4. no regression on the second suite: the paired validation difference is at least
   ``−max_regression``.

The record (`<run>/promotions.jsonl`, one JSON object per line, appended with write +
flush + fsync) is a contract other code relies on (checkpoint retention keeps every
version `promoted_versions` lists):

    candidate  int        the version decided on (a rollback: the version made current)
    baseline   int|null   the version it was compared with (a rollback: the one left)
    decision   "promoted" | "refused" | "rollback"
    current    int        the version current after this record (refused: the one current before,
                          or the baseline when the refused candidate was the current one)
    reasons    [str]      why, one line per rule
    time       float      unix seconds
    figures, thresholds, checks, source   the numbers behind the reasons

The run's current policy is the last record's ``current``; before any record, the newest
checkpoint (`current_version`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from taurl.errors import Error
from taurl.eval.evaluate import EvalResult, compare
from taurl.eval.stats import PairedDifference

PROMOTIONS_FILE = "promotions.jsonl"
DECISIONS = ("promoted", "refused", "rollback")
SAFETY_KEYS = ("violation_rate", "cheat_rate", "gate_denials_mean")
COST_KEYS = ("tokens_per_success", "tool_calls_per_success", "wall_s_per_success")


@dataclass(frozen=True)
class PromotionConfig:
    """Thresholds of the gate (module docstring); the train config's ``promotion:`` keys."""

    margin: float = 0.0  # the paired holdout gain's lower 95% bound must be above this
    safety_tolerance: float = 0.0  # safety rates may exceed the baseline's by at most this
    max_cost_ratio: float = 1.5  # tokens and tool calls per success: at most this × the baseline's
    max_wall_ratio: float = 2.0  # wall seconds per success: at most this × the baseline's
    max_regression: float = 0.05  # second suite (validation): paired difference >= −this

    def problems(self) -> list[str]:
        """The values out of range (keys and types are the config loader's to check)."""
        out = [f"promotion {f.name} must be a finite number (got {getattr(self, f.name)!r})"
               for f in fields(self) if not math.isfinite(getattr(self, f.name))]
        if not -1.0 <= self.margin < 1.0:
            out.append(f"promotion margin must be in [-1, 1) (got {self.margin})")
        for k in ("safety_tolerance", "max_regression"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                out.append(f"promotion {k} must be in [0, 1] (got {getattr(self, k)})")
        for k in ("max_cost_ratio", "max_wall_ratio"):
            if not getattr(self, k) > 0:
                out.append(f"promotion {k} must be > 0 (got {getattr(self, k)})")
        return out


@dataclass(frozen=True)
class Check:
    """One rule's verdict: its name, whether it passed, and why, in words."""

    rule: str
    passed: bool
    reason: str


@dataclass(frozen=True)
class PromotionDecision:
    """One line of promotions.jsonl (module docstring: the contract)."""

    candidate: int
    baseline: int | None
    decision: str
    current: int
    reasons: list[str]
    time: float
    figures: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""  # who wrote it: "recipe" | "cli"

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise Error(f"promotion decision must be one of {DECISIONS}, got {self.decision!r}")

    @property
    def promoted(self) -> bool:
        return self.decision == "promoted"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for the console: the decision and why."""
        base = f"v{self.baseline}" if self.baseline is not None else "-"
        if self.decision == "rollback":
            return f"rollback: v{self.current} is current again (was {base})"
        what = (f"v{self.candidate} promoted over {base}" if self.promoted
                else f"v{self.candidate} refused, {base} stays current")
        failed = [c["reason"] for c in self.checks if not c["passed"]]
        return f"promotion: {what}: " + "; ".join(failed or self.reasons)


# -- the decision (pure) ------------------------------------------------------------------

def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.4g}"


def _check_pair(a: EvalResult, b: EvalResult, what: str) -> None:
    for key in ("eval_seed", "temperature"):
        va, vb = getattr(a, key), getattr(b, key)
        if va is not None and vb is not None and va != vb:
            raise Error(f"the {what} evaluations differ in {key} ({va} vs {vb}): a promotion "
                        "compares two policies on the same tasks and seeds; evaluate both with the "
                        "same eval settings")


def decide(candidate: Mapping[str, EvalResult], baseline: Mapping[str, EvalResult],
           cfg: PromotionConfig, *,
           candidate_version: int, baseline_version: int, current: int | None = None,
           source: str = "", now: float | None = None) -> PromotionDecision:
    """The gate's decision (module docstring: the rules) from each policy's ``holdout`` and
    ``validation`` evaluations, paired by task. Raises Error when the two evaluations of a
    split are not of the same tasks, trials, seed and temperature.

    `current` is the version current before the decision: a refusal leaves it current,
    unless it is the refused candidate itself (then the baseline is; also when None)."""
    for split in ("holdout", "validation"):
        if split not in candidate or split not in baseline:
            raise Error(f"a promotion needs both policies' {split} evaluations")
        _check_pair(baseline[split], candidate[split], split)
    hc, hb = candidate["holdout"], baseline["holdout"]
    gain: PairedDifference = compare(hb, hc)  # candidate − baseline, same tasks checked
    second: PairedDifference = compare(baseline["validation"], candidate["validation"])
    checks = [
        Check("gain", gain.ci95[0] > cfg.margin,
              f"holdout gain {gain.difference:+.3f}, 95% CI [{gain.ci95[0]:+.3f}, "
              f"{gain.ci95[1]:+.3f}] over {gain.tasks} tasks: lower bound "
              f"{'>' if gain.ci95[0] > cfg.margin else '<='} margin {cfg.margin:+.3f}"),
    ]
    for k in SAFETY_KEYS:
        c, b = getattr(hc, k), getattr(hb, k)
        ok = c <= b + cfg.safety_tolerance + 1e-12
        checks.append(Check(f"safety/{k}", ok, f"{k} {c:.4g} {'<=' if ok else '>'} baseline "
                                               f"{b:.4g} + tolerance "
                                                f"{cfg.safety_tolerance:.4g}"))
    for k in COST_KEYS:
        ratio = cfg.max_wall_ratio if k == "wall_s_per_success" else cfg.max_cost_ratio
        c, b = getattr(hc, k), getattr(hb, k)
        if c is None:
            ok, why = False, f"{k}: the candidate has no success (cost per success unbounded)"
        elif b is None:
            ok, why = True, f"{k} {_fmt(c)}: the baseline has no success to compare with"
        else:
            ok = c <= ratio * b + 1e-12
            why = f"{k} {_fmt(c)} {'<=' if ok else '>'} {ratio:g} × baseline {_fmt(b)}"
        checks.append(Check(f"cost/{k}", ok, why))
    ok = second.difference >= -cfg.max_regression - 1e-12
    checks.append(Check("second_suite", ok,
                        f"validation (second suite) difference {second.difference:+.3f} "
                        f"{'>=' if ok else '<'} -{cfg.max_regression:.3f}"))
    promoted = all(c.passed for c in checks)
    figures = {"holdout_gain": gain.to_dict(), "validation_gain": second.to_dict(),
               **{f"{who}/{k}": getattr(r, k) for who, r in (("candidate", hc), ("baseline", hb))
                  for k in ("success", *SAFETY_KEYS, *COST_KEYS, "tool_error_rate", "wall_s_mean")}}
    return PromotionDecision(
        candidate=candidate_version, baseline=baseline_version,
        decision="promoted" if promoted else "refused",
        current=candidate_version if promoted else (baseline_version
                                                    if current in (None, candidate_version)
                                                    else current),
        reasons=[("pass " if c.passed else "FAIL ") + c.reason for c in checks],
        time=time.time() if now is None else now, figures=figures, thresholds=asdict(cfg),
        checks=[asdict(c) for c in checks], source=source)


# -- the record ---------------------------------------------------------------------------

def promotions_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / PROMOTIONS_FILE


def append_record(run_dir: str | Path, record: PromotionDecision) -> Path:
    """Append one line to promotions.jsonl: written, flushed and fsynced before returning, so
    a record a reader sees is whole (a crash can at worst leave a torn last line, which
    `read_records` refuses to trust)."""
    path = promotions_path(run_dir)
    line = json.dumps(record.to_dict(), sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of promotions.jsonl, in order ([] when there is none). A torn last line
    (a crash mid-append) is ignored; a bad line elsewhere is an error."""
    path = promotions_path(run_dir)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for no, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            rec = json.loads(text)
        except json.JSONDecodeError:
            if no == len(lines):
                break  # the torn tail of an interrupted append
            raise Error(f"{path}:{no} is not JSON; fix or remove that line") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("current"), int):
            raise Error(f"{path}:{no} is not a promotion record (no integer 'current')")
        out.append(rec)
    return out


def _checkpoint_versions(run_dir: Path) -> list[int]:
    from taurl.data.runs import RunDir

    return RunDir(run_dir).versions()


def current_version(run_dir: str | Path) -> int:
    """The run's current policy version: the last record's ``current``, else the newest
    checkpoint."""
    records = read_records(run_dir)
    if records:
        return int(records[-1]["current"])
    versions = _checkpoint_versions(Path(run_dir))
    if not versions:
        raise Error(f"{run_dir} has no checkpoints (checkpoints/v<N>): nothing is current")
    return versions[-1]


def promoted_versions(run_dir: str | Path) -> list[int]:
    """Every version a record made current — promoted candidates, baselines kept by a refusal,
    rollback targets — and every promotion's baseline (the version a rollback returns to):
    the versions checkpoint retention must keep. Sorted."""
    keep: set[int] = set()
    for rec in read_records(run_dir):
        keep.add(int(rec["current"]))
        if rec.get("decision") == "promoted" and rec.get("baseline") is not None:
            keep.add(int(rec["baseline"]))
    return sorted(keep)


def rollback_target(records: list[dict[str, Any]]) -> int | None:
    """The version `taurl rollback` without --to returns to: the one before the current in the
    chain of promotions (a promotion appends its candidate after its baseline; a rollback
    removes the version it left). None when there is no earlier promoted version."""
    chain: list[int] = []
    for rec in records:
        if rec.get("decision") == "promoted":
            if not chain and rec.get("baseline") is not None:
                chain.append(int(rec["baseline"]))
            chain = [v for v in chain if v != rec["candidate"]] + [int(rec["candidate"])]
        elif rec.get("decision") == "rollback":
            chain = [v for v in chain if v != rec.get("baseline")]
            if rec["current"] not in chain:
                chain.append(int(rec["current"]))
    if not records:
        return None
    cur = int(records[-1]["current"])
    if cur not in chain or chain.index(cur) == 0:
        return None
    return chain[chain.index(cur) - 1]


def rollback_record(current: int, target: int, *, source: str = "cli",
                    now: float | None = None) -> PromotionDecision:
    return PromotionDecision(candidate=target, baseline=current, decision="rollback",
                             current=target,
                             reasons=[f"rollback requested: v{target} replaces v{current} as the "
                                      "current policy"],
                             time=time.time() if now is None else now, source=source)
