"""`estimator: gae` through the real recipe: a critic is trained, saved and restored.

A tiny search-v0 run takes two real PPO + GAE updates; the run is then killed during update 2's
rollouts and resumed, and the resumed learner must start from the critic saved with v2.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from taurl.data.runs import RunDir
from taurl.policy.model import load_policy
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train
from taurl.train.critic import CRITIC_DIR, WEIGHTS_FILE, Critic, CriticConfig
from taurl.train.learner import Learner

# the miniature of tests/test_recipe.py (its first batch is known to have reward variance),
# with the critic-based estimator
MINI = dict(
    demos=48, expert_options={"p_skip_search": 1.0, "p_guess_right": 1.0},
    task_options={"families": ["country_continent"], "split_by": "country"}, system_prompt="",
    warmup_options={"steps": 10}, sft_batch_size=8, sft_epochs=8, sft_lr=3e-3, sft_warmup_steps=5,
    updates=3, tasks_per_update=4, group_size=4, eval_tasks=3, eval_trials=1, max_turns=1,
    max_action_tokens=16, max_episode_tokens=16, tokenizer_texts=3000, concurrency=16, lr=3e-3,
    temperature=0.5, eval_temperature=0.5,
)
CFG = TrainConfig(
    **MINI, estimator="gae", estimator_options={"gamma": 0.95, "lam": 0.9}, critic_lr=1e-2
)


class Crash(Exception):
    pass


def _critic(run: RunDir, version: int) -> Critic:
    policy, tok = load_policy(run.checkpoint(version))
    c = Critic.from_policy(policy, CriticConfig(), tok.pad_token_id)
    assert c.load(run.checkpoint(version))
    return c


def test_gae_trains_saves_and_restores_its_critic(tmp_path):
    run_dir = tmp_path / "run"

    def hook(name, info):
        if name == "rollouts_stored" and info["update"] == 3:
            raise Crash("killed after update 2")

    with pytest.raises(Crash):
        train(CFG, str(run_dir), progress=False, hook=hook)
    run = RunDir(run_dir)
    assert run.versions() == [0, 1, 2, 3]
    rows = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["update"] for r in rl] == [1, 2]
    for r in rl:
        assert math.isfinite(r["learn/vf_loss"]) and r["learn/vf_loss"] > 0
        assert math.isfinite(r["learn/value_explained_var"]) and r["learn/skipped"] == 0.0
    assert rl[1]["learn/value_mean"] != 0.0  # update 1 trained the zero-initialised head
    # the critic lives next to the policy, whose directory stays a plain HF causal LM
    for v in (2, 3):
        assert (run.checkpoint(v) / CRITIC_DIR / WEIGHTS_FILE).is_file()
        AutoModelForCausalLM.from_pretrained(run.checkpoint(v))
    assert not (run.checkpoint(1) / CRITIC_DIR).exists()  # the SFT policy has none
    assert not (run.checkpoint(2) / CRITIC_DIR / "optimizer.pt").exists()  # kept only in the newest
    assert (run.checkpoint(3) / CRITIC_DIR / "optimizer.pt").exists()
    c2, c3 = _critic(run, 2), _critic(run, 3)
    assert any(
        not torch.equal(p, q)
        for p, q in zip(c2.model.parameters(), c3.model.parameters(), strict=True)
    )

    # resume: the learner restores v3's critic (weights and optimizer) rather than a fresh one
    policy, tok = load_policy(run.checkpoint(3))
    learner = Learner(policy, CFG.learner_config(), pad_id=tok.pad_token_id)
    fresh = [p.detach().clone() for p in learner.critic.model.parameters()]
    assert learner.load_state(run.checkpoint(3))
    restored = list(learner.critic.model.parameters())
    assert all(torch.equal(p, q) for p, q in zip(restored, c3.model.parameters(), strict=True))
    assert any(not torch.equal(p, q) for p, q in zip(restored, fresh, strict=True))
    assert learner.critic.optimizer.state_dict()["state"]  # AdamW moments came back too

    summary = train(CFG, str(run_dir), progress=False)
    assert summary["train"]["updates"] == 3 and summary["train"]["estimator"] == "gae"
    # retention (keep_checkpoints 2) dropped v2 once v4 was saved
    assert run.versions() == [0, 1, 3, 4]
    rl = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    assert [r["update"] for r in rl if r["phase"] == "rl"] == [1, 2, 3]
    assert np.isfinite([r["learn/vf_loss"] for r in rl if r["phase"] == "rl"]).all()
