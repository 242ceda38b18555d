"""benchmarks/long_credit_pool.py: the pre-registered paired decision and the mechanism
checks, on synthetic results whose answers are known."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

BENCH = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
_spec = importlib.util.spec_from_file_location(
    "bench_long_credit_pool", BENCH / "long_credit_pool.py"
)
pool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pool)


def test_decide_reads_the_interval_against_zero():
    assert pool.decide([0.02, 0.03, 0.025, 0.035])[0] == "above"
    assert pool.decide([-0.02, -0.03, -0.025, -0.035])[0] == "below"
    verdict, m, lo, hi = pool.decide([0.05, -0.04, 0.01, -0.02])
    assert verdict == "contains 0" and lo < 0 < hi and math.isclose(m, 0.0, abs_tol=1e-12)


def test_pearson_is_nan_on_a_constant_side():
    assert math.isnan(pool.pearson([1, 1, 1], [0, 1, 2]))
    assert math.isclose(pool.pearson([0, 1, 2, 3], [1, 3, 5, 7]), 1.0)


def _run(est, seed, hold, curve=None, gaps=None):
    curve = curve or [0.5, 0.5, 0.5]
    also = [{"grpo": 0.1, "gigpo γ=0.8": 0.1 + g} for g in (gaps or [0.0] * len(curve))]
    return {"estimator": est, "seed": seed, "curve": curve, "episodes_per_update": 32,
            "holdout": {"final": {"success": hold}, "sft": {"success": 0.4}},
            "validation": {"final": {"success": hold}, "sft": {"success": 0.4}},
            "alignment": [{"corr": 0.1, "also": a} for a in also],
            "diagnostics": {"invalid": [0.01] * len(curve), "entropy": [0.2] * len(curve)}}


def test_report_pairs_by_policy_and_seed_and_finds_the_gap_tracking_success(tmp_path):
    for name, shift in (("p0", 0.0), ("p1", 0.3)):  # a policy effect the pairing must cancel
        d = tmp_path / name
        d.mkdir()
        runs = []
        for s in range(4):
            # the gap grows with the update's success in every base run
            runs.append(
                _run(
                    "grpo", s, 0.2 + shift + 0.01 * s, curve=[0.1, 0.5, 0.9], gaps=[0.0, 0.02, 0.04]
                )
            )
            runs.append(_run("gigpo", s, 0.23 + shift + 0.01 * s + 0.001 * (s % 2)))
        (d / "results.jsonl").write_text("\n".join(json.dumps(r) for r in runs))
    text = pool.report(
        pool.load([str(tmp_path / "p0"), str(tmp_path / "p1")]), "grpo", "gigpo", "gigpo γ=0.8"
    )
    holdout = next(line for line in text.splitlines() if line.startswith("| holdout |"))
    assert "| 8 |" in holdout and "interval above" in holdout  # +0.03 on every pair
    assert "same-batch alignment gap" in text and "+0.020" in text
    assert "pooled r = +1.000" in text


def test_gap_series_refuses_records_that_do_not_line_up():
    r = _run("grpo", 0, 0.3, curve=[0.1, 0.2, 0.3])
    r["alignment"] = r["alignment"][:2]  # an update without a credited batch
    assert pool.gap_series(r, "gigpo γ=0.8", "grpo") == ([], [])


def test_arms_table_pairs_each_arm_with_the_base_by_policy_and_seed():
    base = [[_run("grpo", s, 0.30 + 0.1 * p) for s in range(3)] for p in range(2)]
    other = [[_run("salt", s, 0.28 + 0.1 * p + 0.001 * s) for s in range(3)] for p in range(2)]
    other[1][2]["curve"] = [0.5, 0.0, 0.0, 0.0]  # collapsed from update 2
    text = pool.arms_table({"salt": ("salt", other)}, "grpo", base)
    row = next(line for line in text.splitlines() if line.startswith("| salt |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert (
        cells[1] == "6"
        and cells[3].startswith("-0.019")
        and cells[3].endswith("(6)")
        and cells[4] == "1"
    )


def test_cli_refuses_bad_input_before_reading_anything(tmp_path):
    import subprocess

    def run(*args):
        return subprocess.run(
            [sys.executable, str(BENCH / "long_credit_pool.py"), *args],
            capture_output=True,
            text=True,
        )

    r = run(str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "no results.jsonl in" in r.stderr
    (tmp_path / "results.jsonl").write_text(json.dumps(_run("grpo", 0, 0.3)) + "\n")
    r = run(str(tmp_path), "--arms", "{not json")
    assert r.returncode == 2 and "--arms is not JSON" in r.stderr
    r = run(str(tmp_path), "--arms", '{"rloo": {"estimator": "rloo", "dirs": ["a", "b"]}}')
    assert r.returncode == 2 and "one directory per positional directory (1)" in r.stderr
