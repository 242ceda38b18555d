"""benchmarks/async_learning.py: the arms' config keys and the report's statistics, on
synthetic results with hand-computed intervals."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from taurl.recipe.config import TrainConfig
from taurl.recipe.sections import flat_options
from taurl.recipe.validate import load_config

ROOT = Path(__file__).parents[1]
# async_learning imports its siblings long_credit / estimators
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location(
    "bench_async_learning", ROOT / "benchmarks/async_learning.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

T2 = 4.302652729911275  # Student t, df = 2, two-sided 95%


def test_paired_difference_by_hand():
    # diffs 0.1, 0.2, 0.3: mean 0.2, sample sd 0.1, half-width t_2 · 0.1/√3 = 0.248414
    m, lo, hi = bench.paired_difference([0.1, 0.2, 0.3])
    h = T2 * 0.1 / math.sqrt(3)
    assert m == pytest.approx(0.2) and lo == pytest.approx(0.2 - h) and hi == pytest.approx(0.2 + h)
    assert lo < 0  # not clipped to [0, 1]: a difference may be negative
    m, lo, hi = bench.paired_difference([-0.05])
    assert m == -0.05 and math.isnan(lo) and math.isnan(hi)


def _run(arm: str, seed: int, hold: dict[str, int], val: float = 0.5) -> dict:
    trials = 3
    final = {
        "success": sum(hold.values()) / (trials * len(hold)),
        "task_successes": hold,
        "trials": trials,
    }
    return {
        "arm": arm,
        "seed": seed,
        "updates": 2,
        "episodes_per_update": 64,
        "holdout": {"sft": {"success": 0.2}, "final": final},
        "validation": {
            "sft": {"success": 0.21},
            "final": {"success": val, "task_successes": {}, "trials": 3},
        },
        "staleness_mean": 0.0 if arm == "sync" else 1.5,
        "staleness_p95": 0 if arm == "sync" else 4,
        "staleness_max": 0 if arm == "sync" else 4,
        "dropped_stale_groups": 0,
        "aborted_groups": 0,
        "trained_episodes": 128,
        "sampled_episodes": 192,
        "wall_s": 10.0,
        "curves": {k: [0.1, 0.2] for k in bench.PER_UPDATE},
    }


def test_task_paired_difference_pools_seeds_per_task():
    # task a: arm 3+3 of 6 vs sync 1+2 of 6 -> +0.5; task b: arm 0+1 of 6 vs sync 1+1 -> -1/6
    arm = [_run("async-eta4", 0, {"a": 3, "b": 0}), _run("async-eta4", 1, {"a": 3, "b": 1})]
    sync = [_run("sync", 0, {"a": 1, "b": 1}), _run("sync", 1, {"a": 2, "b": 1})]
    m, lo, hi = bench.task_paired_difference(arm, sync, "holdout")
    d = [0.5, -1 / 6]
    sd = abs(d[0] - d[1]) / math.sqrt(2)
    h = 12.706204736174707 * sd / math.sqrt(2)  # t, df = 1
    assert (
        m == pytest.approx(sum(d) / 2) and lo == pytest.approx(m - h) and hi == pytest.approx(m + h)
    )


def test_tables_pair_by_seed_and_keep_arm_order():
    # holdout success per seed: sync 1/6, 2/6, 3/6 ; async-eta4 2/6, 4/6, 3/6 -> Δ 1/6, 2/6, 0
    sync = [_run("sync", s, {"a": k, "b": 0}) for s, k in enumerate((1, 2, 3))]
    asy = [_run("async-eta4", s, {"a": k, "b": 0}) for s, k in enumerate((2, 3, 3))]
    asy[1]["holdout"]["final"]["task_successes"] = {"a": 3, "b": 1}
    asy[1]["holdout"]["final"]["success"] = 4 / 6
    text = bench.tables(asy[::-1] + sync)  # out of order on purpose
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("| sync") or line.startswith("| async")
    ]
    assert rows[0].startswith("| sync | 3 |") and rows[1].startswith("| async-eta4 | 3 |")
    m, lo, hi = bench.paired_difference([1 / 6, 2 / 6, 0.0])
    # the seed-paired holdout Δ
    assert f"| async-eta4 − sync | 3 | +{m:.3f} [{lo:+.3f}, {hi:+.3f}] |" in text
    assert "async-eta4-ppo − async-eta4" not in text  # no naive arm in these results
    naive = [_run("async-eta4-ppo", s, {"a": 2, "b": 0}) for s in range(2)]  # 2/6 both seeds
    m, lo, hi = bench.paired_difference([2 / 6 - 2 / 6, 2 / 6 - 4 / 6])  # vs async-eta4 seeds 0, 1
    assert f"| async-eta4-ppo − async-eta4 | 2 | {m:+.3f} [{lo:+.3f}, {hi:+.3f}] |" in bench.tables(
        asy + sync + naive
    )
    assert "0.333 0.667 0.500" in text  # async's per-seed holdout, seeds ascending
    assert "| async-eta4 | 1.50 | 4 | 4 |" in text and "| 128 / 192 |" in text


def test_arm_configs_are_valid_on_the_demo_config():
    base = load_config(TrainConfig, path=ROOT / "configs/demo.yaml")
    for arm, (schedule, eta, objective) in bench.ARMS.items():
        cfg = load_config(TrainConfig, data={**flat_options(base), **bench.arm_overrides(arm)})
        assert cfg.problems() == [], arm
        assert (cfg.schedule, cfg.objective) == (schedule, objective)
        if schedule == "async":
            # room for the η + 1 batches the admission rule lets run at once
            assert (
                cfg.staleness_eta == eta
                and cfg.concurrency == (eta + 1) * cfg.tasks_per_update * cfg.group_size
            )
    assert bench.ARMS["async-eta4-ppo"] == ("async", 4, "ppo")  # the naive arm: no proximal policy
