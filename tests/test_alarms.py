"""Health alarms (taurl.monitor.alarms): each alarm fires on rows built to trip it and not
on neutral ones; a real run constructed as an Echo Trap (a reward that collapses to a
constant after the first update) is flagged and stopped; two full demo runs' rows and a
real short run stay quiet; bad `alarms:` options are refused before any file is written."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from taurl import envs
from taurl.errors import ConfigError, ResetNeeded
from taurl.monitor.alarms import ALARMS, AlarmConfig, Watch, alarm_config, check, scan
from taurl.monitor.report import alarms_section
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train
from taurl.recipe.validate import load_config
from word_env import answer_of, say_the_answer, word_tasks

FIXTURES = Path(__file__).parent / "fixtures"


def neutral(update: int, **over: float) -> dict:
    """A healthy update's row (values of the demo's range)."""
    row = {
        "phase": "rl",
        "update": update,
        "rollout/reward_std": 0.45,
        "rollout/groups_same_reward": 0.125,
        "learn/entropy": 0.1,
        "learn/grad_norm": 0.5,
        "learn/skipped": 0.0,
        "rollout/invalid_rate": 0.03,
        "rollout/truncation_rate": 0.02,
        "rollout/staleness_max": 0.0,
        "mismatch/abs_mean": 0.0,
        "mismatch/abs_max": 0.0,
        "mismatch/tokens": 500.0,
    }
    return {**row, **over}


def fired_at_end(rows: list[dict], cfg: AlarmConfig | None = None) -> set[str]:
    return {a.name for a in check(rows, cfg or AlarmConfig())}


def test_neutral_rows_fire_nothing():
    rows = [neutral(u) for u in range(1, 21)]
    assert scan(rows, AlarmConfig()) == []


# (alarm, rows 1..n: the last ones bent to trip it). Defaults: k = 3, window 10, min_history 5.
CASES = {
    "reward_std_collapse": [neutral(u) for u in range(1, 4)]
    + [neutral(u, **{"rollout/reward_std": 0.0}) for u in range(4, 7)],
    "same_reward_groups": [neutral(u) for u in range(1, 4)]
    + [neutral(u, **{"rollout/groups_same_reward": 1.0}) for u in range(4, 7)],
    "entropy_collapse": [neutral(u) for u in range(1, 4)]
    + [neutral(u, **{"learn/entropy": 0.005}) for u in range(4, 7)],
    # 0.6 > 5 x median 0.1 of the five rows before
    "entropy_spike": [neutral(u) for u in range(1, 6)] + [neutral(6, **{"learn/entropy": 0.6})],
    # > 5 x 0.5
    "grad_norm_spike": [neutral(u) for u in range(1, 6)] + [neutral(6, **{"learn/grad_norm": 2.6})],
    # first five 0.03, last five 0.25: +0.22 > 0.15
    "invalid_rate_rising": [neutral(u) for u in range(1, 6)]
    + [neutral(u, **{"rollout/invalid_rate": 0.25}) for u in range(6, 11)],
    "truncation_rate_rising": [neutral(u) for u in range(1, 6)]
    + [
        # 0.2 - 0.02 = 0.18 > 0.15
        neutral(u, **{"rollout/truncation_rate": 0.2})
        for u in range(6, 11)
    ],
    "staleness": [neutral(1), neutral(2, **{"rollout/staleness_max": 1.0})],
    "logprob_drift": [neutral(1), neutral(2, **{"mismatch/abs_mean": 2e-3})],
}


def test_every_alarm_has_a_case():
    assert set(CASES) == set(ALARMS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_alarm_fires_on_its_case_and_only_there(name):
    rows = CASES[name]
    assert fired_at_end(rows) == {name}
    assert fired_at_end(rows[:-1]) == set() or name in (
        "invalid_rate_rising",
        "truncation_rate_rising",
    )
    assert fired_at_end(rows, AlarmConfig(disable=[name])) == set()
    assert fired_at_end(rows, AlarmConfig(enabled=False)) == set()


def test_persistent_alarms_need_k_consecutive_updates():
    rows = CASES["reward_std_collapse"]
    assert fired_at_end(rows[:5]) == set()  # two collapsed updates of the three needed
    assert fired_at_end(rows[:5], AlarmConfig(consecutive=2)) == {"reward_std_collapse"}
    broken = rows[:4] + [neutral(5)] + rows[5:] + [neutral(7, **{"rollout/reward_std": 0.0})]
    assert fired_at_end(broken) == set()  # 4 collapsed, 5 not, 6 and 7 collapsed: only two in a row


def test_relative_alarms_wait_for_a_baseline_and_use_the_median():
    spike = [neutral(u) for u in range(1, 5)] + [neutral(5, **{"learn/grad_norm": 2.6})]
    assert fired_at_end(spike) == set()  # only 4 earlier rows < min_history 5
    # an earlier spike does not raise the median enough to hide the next one
    rows = [neutral(u) for u in range(1, 6)] + [neutral(6, **{"learn/grad_norm": 50.0}), neutral(7),
                                                 neutral(8, **{"learn/grad_norm": 3.0})]
    assert fired_at_end(rows) == {"grad_norm_spike"}
    # updates that took no step (grad norm 0) are not part of the baseline nor checked
    skipped = [neutral(u, **{"learn/grad_norm": 0.0, "learn/skipped": 1.0}) for u in range(1, 6)]
    assert fired_at_end(skipped + [neutral(6, **{"learn/grad_norm": 9.0})]) == set()


def test_staleness_is_inactive_without_its_metric():
    row = neutral(2)
    del row["rollout/staleness_max"]
    assert fired_at_end([neutral(1), row]) == set()
    assert fired_at_end(CASES["staleness"], AlarmConfig(staleness_eta=1)) == set()


def test_watch_adds_metrics_logs_and_says_stop(caplog):
    watch = Watch({"stop_on": ["reward_std_collapse"]})
    rows = CASES["reward_std_collapse"]
    with caplog.at_level(logging.WARNING, logger="taurl.alarms"):
        fired = [watch.observe(dict(r)) for r in rows]
    assert [watch.stops(f) for f in fired] == [[], [], [], [], [], ["reward_std_collapse"]]
    assert (
        watch.rows[-1]["alarm/reward_std_collapse"] == 1.0
        and watch.rows[-2]["alarm/reward_std_collapse"] == 0.0
    )
    assert {k for k in watch.rows[-1] if k.startswith("alarm/")} == {f"alarm/{n}" for n in ALARMS}
    assert "ALARM reward_std_collapse at update 6: reward std 0.0000 <= 0.01" in caplog.text


def test_full_demo_runs_stay_quiet():
    """The RL rows of two full `taurl demo` runs (30 updates each, 2026-12-01, configs/demo.yaml;
    the first with sft_max_seconds 420) fire no alarm with the defaults."""
    rows = [
        json.loads(line) for line in (FIXTURES / "demo_rl_metrics.jsonl").read_text().splitlines()
    ]
    for run in ("demo", "demo2"):
        mine = [r for r in rows if r["run"] == run]
        assert len(mine) == 30
        assert scan(mine, AlarmConfig()) == []


@pytest.mark.parametrize("options, message", [
    ({"stop_onn": []}, "did you mean 'stop_on'"),
    ({"stop_on": ["reward_collapse"]}, "did you mean 'reward_std_collapse'"),
    ({"consecutive": 0}, "consecutive must be >= 1"),
    ({"grad_norm_spike": "big"}, "grad_norm_spike must be a number"),
    ({"enabled": "yes"}, "enabled must be true or false"),
])
def test_bad_alarm_options_are_refused(options, message):
    _, problems = alarm_config(options)
    assert any(message in p for p in problems), problems
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, {"alarms": options})


def test_bad_alarm_options_at_the_cli_write_nothing(tmp_path, capsys):
    from taurl.cli.main import main

    rc = main(["train", "--run-dir", str(tmp_path / "r"), "--alarms", '{"stop_onn": []}'])
    err = capsys.readouterr().err
    assert rc != 0 and "did you mean 'stop_on'" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------------------
# A real run built as an Echo Trap


COLLAPSED = {"on": False}


class CollapseEnv:
    """One answer turn. Before the collapse the reward is a coin of the episode's seed (so
    every group has reward variance); after it, 0 for every episode whatever is answered:
    the reward signal has collapsed to a constant, as in RAGEN's Echo Trap."""

    name, version, verifier_version = "echotrap-v0", "1", "echotrap-1"
    observation_style, stop, tools = "inline", ("</answer>",), []
    system_prompt = ""

    def __init__(self, max_turns: int = 1):
        self.seed, self._live = 0, False

    def reset(self, task, seed=None):
        self.seed, self._live = seed or 0, True
        return "", {}

    def step(self, action):
        if not self._live:  # the Env contract (check_env): a step needs a reset first
            raise ResetNeeded("echotrap-v0: call reset(task, seed) before step")
        self._live = False
        answer = answer_of(action)
        reward = 0.0 if COLLAPSED["on"] else float(self.seed % 2)
        return (
            "",
            reward,
            True,
            False,
            {
                "action": {"kind": "answer", "answer": answer},
                "invalid": False,
                "stop_reason": "answered",
            },
        )


if "echotrap-v0" not in envs.registry._SPECS:
    envs.register(
        "echotrap-v0", CollapseEnv, tasks=word_tasks("echotrap-v0", "Echo", prefix="echo"),
        expert=say_the_answer,
    )

TINY = dict(
    env="echotrap-v0", demos=16, sft_epochs=1, sft_batch_size=8, tasks_per_update=2, group_size=4,
    eval_tasks=2, eval_trials=1, max_turns=1, max_action_tokens=6, max_episode_tokens=6,
    concurrency=8,
)


def test_echo_trap_run_is_flagged_and_stopped(tmp_path, caplog):
    COLLAPSED["on"] = False

    def hook(event, info):  # the reward collapses after the first RL update
        if event == "update_done":
            COLLAPSED["on"] = True

    cfg = TrainConfig(**TINY, updates=6, alarms={"stop_on": ["reward_std_collapse"]})
    try:
        with caplog.at_level(logging.WARNING, logger="taurl"):
            summary = train(cfg, str(tmp_path / "run"), progress=False, hook=hook)
    finally:
        COLLAPSED["on"] = False
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert rl[0]["rollout/reward_std"] > 0  # a live signal before the collapse
    assert [r["rollout/reward_std"] for r in rl[1:]] == [0.0, 0.0, 0.0]
    assert [r["alarm/reward_std_collapse"] for r in rl] == [0.0, 0.0, 0.0, 1.0]
    assert [r["alarm/same_reward_groups"] for r in rl] == [0.0, 0.0, 0.0, 1.0]
    assert summary["train"]["stopped_early"] == 4 and summary["train"]["updates"] == 4  # of 6
    assert "ALARM reward_std_collapse at update 4" in caplog.text
    assert "RL stopped after update 4 of 6 by alarm(s) reward_std_collapse" in caplog.text
    report = (tmp_path / "run/report.html").read_text()
    assert (
        "Health alarms" in report
        and "RL was stopped after update 4 by reward_std_collapse" in report
    )
    assert alarms_section(summary, rows).count("<tr>") == 3  # header + the two alarms that fired


def test_a_healthy_short_run_stays_quiet(tmp_path):
    """The same env without the collapse: 4 updates with reward variance, no alarm."""
    COLLAPSED["on"] = False
    summary = train(TrainConfig(**TINY, updates=4), str(tmp_path / "run"), progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert len(rl) == 4 and all(r["rollout/reward_std"] > 0 for r in rl)
    assert all(r[f"alarm/{n}"] == 0.0 for r in rl for n in ALARMS)
    assert "All quiet: 9 alarms checked over 4 RL updates" in alarms_section(summary, rows)
