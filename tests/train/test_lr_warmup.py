"""`lr_warmup_steps`: the RL learner's linear learning-rate warm-up.

Why it exists: AdamW's bias-corrected first step moves every parameter with a gradient by
≈ lr (lr · g / |g|), whatever the gradient's size (docs/experiments/long-credit.md, "Why
one update breaks the greedy policy"). With a warm-up of k steps, step n moves them by
≈ lr · n / k. A tiny Qwen2 policy and two real records (a success and a failure of one
task) measure that directly; the count comes from AdamW's own state, so a resumed learner
continues the warm-up.
"""

from __future__ import annotations

import pytest
import torch
from tests.train.test_critic_warmup import _model, _traj

from taurl.errors import ConfigError
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.optim import optimizer_steps, warmup_lr

LR = 1e-3


def test_warmup_lr_by_hand():
    assert warmup_lr(LR, 1, 0) == LR  # off
    assert warmup_lr(LR, 1, 4) == pytest.approx(2.5e-4)
    assert warmup_lr(LR, 3, 4) == pytest.approx(7.5e-4)
    assert warmup_lr(LR, 4, 4) == warmup_lr(LR, 40, 4) == LR


def _batch(model):
    return [_traj(model, "e0", [[10, 11], [12]], 1.0), _traj(model, "e1", [[13, 14], [15]], 0.0)]


def _update(learner, batch) -> tuple[dict, float]:
    """One update's stats and the largest change of any weight it made."""
    before = [p.detach().clone() for p in learner.model.parameters()]
    stats = learner.update(batch, version=0)
    return stats, max(
        float((p.detach() - b).abs().max())
        for p, b in zip(learner.model.parameters(), before, strict=True)
    )


@pytest.mark.parametrize("warmup", [0, 4])
def test_each_step_moves_the_weights_by_its_warmed_up_lr(warmup):
    torch.manual_seed(0)
    model = _model()
    learner = Learner(model, LearnerConfig(lr=LR, lr_warmup_steps=warmup), pad_id=0)
    batch = _batch(model)
    for n in (1, 2):
        stats, moved = _update(learner, batch)
        expect = warmup_lr(LR, n, warmup)
        assert stats["learn/lr"] == pytest.approx(expect)
        assert optimizer_steps(learner.optimizer) == n
        # AdamW's first step: lr · g/|g| per weight, so the largest move is the lr itself
        if n == 1:
            assert moved == pytest.approx(expect, rel=0.01)
        else:
            assert moved <= expect * 1.01


def test_a_resumed_learner_continues_the_warmup_from_the_optimizer_state():
    torch.manual_seed(0)
    model = _model()
    cfg = LearnerConfig(lr=LR, lr_warmup_steps=4)
    first = Learner(model, cfg, pad_id=0)
    batch = _batch(model)
    first.update(batch, version=0)
    first.update(batch, version=0)
    resumed = Learner(model, cfg, pad_id=0)
    assert optimizer_steps(resumed.optimizer) == 0
    # what load_optimizer_state does
    resumed.optimizer.load_state_dict(first.optimizer.state_dict())
    assert resumed.update(batch, version=0)["learn/lr"] == pytest.approx(7.5e-4)  # step 3 of 4


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_warmup_is_a_config_problem(bad):
    with pytest.raises(ConfigError, match="lr_warmup_steps"):
        Learner(_model(), LearnerConfig(lr_warmup_steps=bad), pad_id=0)
