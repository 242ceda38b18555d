"""The logprob_drift alarm's bounds follow the run's numerics (`AlarmConfig.drift_bounds`).

bf16 on the learner (train.precision bf16-mixed) or the engine (policy.torch_dtype bfloat16)
puts ~1e-3 of rounding into |learner − behaviour logprob| (the demo: median mean 1.25e-3 vs
7e-7 in fp32): the fp32 bounds (1e-3 mean, 1e-2 max) fired on every such update. The low
bounds are 0.1 / 1.0; a real drift still fires.
"""

from __future__ import annotations

import json

import pytest

from taurl.monitor.alarms import AlarmConfig, Watch, alarm_config, check, low_precision
from taurl.monitor.report import alarms_section
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train
from test_alarms import COLLAPSED, TINY, neutral  # pytest puts tests/ on sys.path

# a bf16-mixed update of the demo as measured (mean 1.16e-3, max 0.098; 2026-12-06)
BF16_ROW = {"mismatch/abs_mean": 1.16e-3, "mismatch/abs_max": 0.098}


def test_bf16_rounding_is_quiet_under_the_low_bounds_and_loud_under_fp32s():
    rows = [neutral(1, **BF16_ROW), neutral(2, **BF16_ROW)]
    assert {a.name for a in check(rows, AlarmConfig())} == {"logprob_drift"}
    assert check(rows, AlarmConfig(low_precision=True)) == []
    drifted = [neutral(1), neutral(2, **{"mismatch/abs_mean": 0.3, "mismatch/abs_max": 2.0})]
    (alarm,) = check(drifted, AlarmConfig(low_precision=True))
    assert alarm.name == "logprob_drift" and "> 0.1" in alarm.message and "> 1" in alarm.message
    watch = Watch({}, low=True)
    assert watch.observe(neutral(1, **BF16_ROW)) == [] and Watch({}).observe(neutral(1, **BF16_ROW))


@pytest.mark.parametrize("precision,dtype,low", [
    ("fp32", "float32", False), ("bf16-mixed", "float32", True), ("fp16-mixed", "float32", True),
    ("fp32", "bfloat16", True)])
def test_which_runs_are_low_precision(precision, dtype, low):
    assert low_precision(precision, dtype) is low


def test_the_bounds_are_options_and_the_flag_is_not():
    cfg, problems = alarm_config({"drift_abs_mean_low": 0.05})
    assert problems == [] and cfg.drift_abs_mean_low == 0.05
    assert "unknown option 'low_precision'" in alarm_config({"low_precision": True})[1][0]


def test_the_report_rechecks_with_the_runs_precision():
    rows = [neutral(u, **BF16_ROW) for u in (1, 2)]
    summary = {"config": {"precision": "bf16-mixed", "torch_dtype": "float32", "alarms": {}}}
    assert "All quiet" in alarms_section(summary, rows)
    assert "logprob_drift" in alarms_section({"config": {"alarms": {}}}, rows)


def test_a_bf16_mixed_run_is_quiet_about_its_own_rounding(tmp_path):
    """A real run in bf16-mixed: its mismatch passes the fp32 bounds, no drift alarm fires."""
    COLLAPSED["on"] = False
    train(TrainConfig(**TINY, updates=3, precision="bf16-mixed"), str(tmp_path / "run"),
          progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert len(rl) == 3
    assert any(r["mismatch/abs_mean"] > 1e-3 or r["mismatch/abs_max"] > 1e-2 for r in rl), rl
    assert all(r["alarm/logprob_drift"] == 0.0 for r in rl)
