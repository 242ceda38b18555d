"""The step scorer, replay and the curriculum through the real recipe (a tiny search-v0 run).

Three real updates with ``step_scorer: implicit_prm`` + ``estimator: istar`` + replay +
curriculum: the shaping is in the metrics and in shaping.jsonl, never in the ledger; φ is
saved with each RL checkpoint (and restored from it: `Learner.load_state`). Resuming
replay and curriculum state is tested in tests/test_replay_curriculum.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.policy.model import load_policy
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train
from taurl.train.prm import PRM_DIR, WEIGHTS_FILE, ImplicitPRM, PRMConfig

# the miniature of tests/train/test_gae_recipe.py, at two turns so a step scorer has steps to
# tell apart, with a pool of 8 RL tasks the curriculum draws 4 from
MINI = dict(
    demos=48, expert_options={"p_skip_search": 0.5, "p_guess_right": 1.0},
    task_options={"families": ["country_continent"], "split_by": "country"}, system_prompt="",
    warmup_options={"steps": 10}, sft_batch_size=8, sft_epochs=8, sft_lr=3e-3, sft_warmup_steps=5,
    updates=3, tasks_per_update=4, group_size=4, eval_tasks=2, eval_trials=1, max_turns=2,
    max_action_tokens=16, max_episode_tokens=32, tokenizer_texts=3000, concurrency=16, lr=3e-3,
    temperature=0.7, eval_temperature=0.5,
)
CFG = TrainConfig(
    **MINI,
    estimator="istar",
    step_scorer="implicit_prm",
    step_scorer_options={"weight": 0.1, "clip": 0.1, "lr": 1e-3},
    replay={"capacity": 8, "max_age": 2, "fraction": 0.5},
    curriculum={"mix": [0.3, 0.5, 0.2]},
)


def test_step_scorer_replay_and_curriculum_train_end_to_end(tmp_path):
    run = RunDir(tmp_path / "run")
    summary = train(CFG, str(run.root), progress=False)
    assert summary["train"]["updates"] == CFG.updates

    rows = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["update"] for r in rl] == [1, 2, 3]
    assert (run.checkpoint(4) / PRM_DIR / WEIGHTS_FILE).is_file()  # φ saved with the policy
    for r in rl:  # the mix is recorded per update: every task drawn is in a bucket
        assert (
            r["curriculum/easy"] + r["curriculum/medium"] + r["curriculum/hard"]
            == CFG.tasks_per_update
        )
        assert "learn/prm_pairs" in r and "learn/prm_shaping_sum_abs_max" in r
        assert r["learn/prm_shaping_sum_abs_max"] < 1e-9  # shaping never changes an episode's total
    # nothing stored, nothing seen yet at update 1
    assert (
        rl[0]["replay/groups"] == 0
        and rl[0]["curriculum/unseen"] == CFG.updates * CFG.tasks_per_update
    )
    assert sum(r["learn/prm_steps"] for r in rl) > 0  # some group had a success and a failure
    assert any(r["replay/groups"] > 0 for r in rl[1:])
    for r in rl:  # the engine-vs-learner check reads the fresh rows only, not the replayed ones
        assert r["mismatch/abs_max"] < 1e-2 and r["alarm/logprob_drift"] == 0.0

    # per step, apart from the ledger: shaping.jsonl; the ledger's rewards are the env's
    shaped = [json.loads(x) for x in (run.root / "shaping.jsonl").read_text().splitlines()]
    assert shaped and all(abs(sum(s["shaping"])) < 1e-9 for s in shaped)
    assert any(any(abs(x) > 0 for x in s["shaping"]) for s in shaped)
    with Ledger(run.ledger) as ledger:
        for s in shaped[:20]:
            t = ledger.get(s["episode_id"])
            assert t.reward == pytest.approx(sum(t.reward_components.values()))
            assert "shaping" not in t.metadata and len(s["shaping"]) == len(t.turns)
    # φ of the final version differs from the SFT policy it started from
    phi = ImplicitPRM(load_policy(run.checkpoint(1))[0], PRMConfig())
    sft_params = [p.detach().clone() for p in phi.model.parameters()]
    assert phi.load(run.checkpoint(4))
    assert any(
        not torch.equal(p, q) for p, q in zip(phi.model.parameters(), sft_params, strict=True)
    )


def test_the_defaults_leave_the_recipe_unchanged():
    cfg = TrainConfig()
    assert (cfg.step_scorer, cfg.step_scorer_options, cfg.replay, cfg.curriculum) == (
        "none", {}, {}, {},
    )
    assert dataclasses.replace(cfg).mixing_problems() == []
