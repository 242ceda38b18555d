"""benchmarks/estimators.py: no seed or variant trains on the SFT policy's tasks."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

from taurl.recipe.config import TrainConfig

_spec = importlib.util.spec_from_file_location(
    "bench_estimators", Path(__file__).parents[1] / "benchmarks/estimators.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

BASE = TrainConfig(demos=200, updates=5, tasks_per_update=4, eval_tasks=10,
                   task_options={"families": ["city_country"], "split_by": "city"})


def test_each_seeds_rl_trains_on_tasks_the_sft_policy_never_saw():
    # what the benchmark varies: the RL seed, the estimator, the number of updates
    for seed in (0, 1, 2):
        for updates in (3, 5, 9):
            v = dataclasses.replace(BASE, rl_seed=seed, estimator="gigpo", updates=updates)
            assert bench.sft_task_overlap(BASE, v) == []
    # the RL pool is disjoint from the SFT policy's demonstrations, checked directly too
    demos = {t.task_id for t in bench.task_plan(BASE).demos}
    assert not demos & {t.task_id for t in bench.task_plan(dataclasses.replace(BASE, rl_seed=7)).rl}


def test_an_override_that_reshuffles_the_plan_is_caught():
    # the seed reshuffles the pool
    assert bench.sft_task_overlap(BASE, dataclasses.replace(BASE, seed=1))
    # demo tasks slide into RL
    assert bench.sft_task_overlap(BASE, dataclasses.replace(BASE, demos=100))
