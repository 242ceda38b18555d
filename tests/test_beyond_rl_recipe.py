"""The three stages beyond RL as steps of the recipe (taurl.recipe.stages), end to end on a tiny
env: each run from one SFT checkpoint writes the RL run's summary.json keys (plus its stage),
with the evaluations and the promotion gate."""

from __future__ import annotations

import json

import pytest

import taurl
from taurl.errors import Error
from test_api import SMALL, EchoEnv, length_reward, tasks


def test_each_stage_runs_from_an_sft_checkpoint_with_the_rl_summary_keys(tmp_path):
    base = taurl.train(
        EchoEnv, tasks=tasks(), reward=length_reward, run_dir=tmp_path / "rl", progress=False,
        **SMALL,
    )
    start, teacher = (
        tmp_path / "rl/checkpoints/v1",
        tmp_path / f"rl/checkpoints/v{base['train']['policy_version']}",
    )
    stages = {
        "rejection": {"sft": "rejection", "rejection": {"rounds": 2, "attempts": 2, "tasks": 2}},
        "dpo": {"sft": "none", "objective": "dpo", "dpo": {"pairs": "all"}},
        "distill": {"sft": "none", "teacher": str(teacher)},
    }
    # rejection keeps only samples its verifier passes (>= 1.0), which the length reward never
    # gives in 8 tokens: a stage that keeps nothing now fails (issue 38), so it is rewarded 1
    rewards = {"rejection": lambda traj, task: 1.0}
    for name, options in stages.items():
        s = taurl.train(EchoEnv, tasks=tasks(), reward=rewards.get(name, length_reward),
                        run_dir=tmp_path / name, progress=False, model=str(start),
                        **{**SMALL, **options})
        assert set(base) <= set(s) and set(base["train"]) <= set(s["train"]), name
        assert s["train"]["stage"] == name and s["train"]["updates"] == 2
        assert s["holdout"]["sft"]["policy_version"] == 1 and s["promotion"]["candidate"] == 3
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        phase = "rejection" if name == "rejection" else "rl"
        assert len([r for r in rows if r.get("phase") == phase]) == 2
    dpo = [json.loads(x) for x in (tmp_path / "dpo/metrics.jsonl").read_text().splitlines()]
    # the length reward ranks the episodes of a task
    assert any(r.get("learn/dpo_pairs", 0) > 0 for r in dpo)
    rounds = json.loads((tmp_path / "rejection/summary.json").read_text())["train"]["rejection"]
    assert [r["round"] for r in rounds] == [1, 2] and all(r["kept"] > 0 for r in rounds)


def test_a_rejection_stage_that_keeps_no_episode_fails_instead_of_exiting_0(tmp_path):
    """Issue 38 H1: rejection rounds whose samples the verifier never passes trained nothing,
    wrote the SFT weights as the stage's policy and exited 0; now the stage raises, saying
    so. (A reward of 0 everywhere: the training-outcome verifier passes no sample.)"""
    with pytest.raises(Error, match=r"sft: rejection kept no episode in 1 round\(s\) of 4 sampled"):
        taurl.train(EchoEnv, tasks=tasks(), reward=lambda traj, task: 0.0, run_dir=tmp_path / "r",
                    progress=False, **{**SMALL, "sft": "rejection",
                                       "rejection": {"rounds": 1, "attempts": 2, "tasks": 2}})
