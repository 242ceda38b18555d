"""Dr. GRPO's normalizer is one constant for the whole run, for every loss term.

``seq-mean-token-sum-norm`` divides the summed per-sequence losses by S·C. With C the
padded width of each micro-batch (the old default) the loss of a row depended on which
length bucket it fell in and on its prompt and observation tokens — per-sequence length
normalization by another name, the bias Dr. GRPO (arXiv 2503.20783 §3.2) removes — and the
KL term never got C at all. Now C is `LearnerConfig.norm_constant` (taurl train: the
generation budget, max_episode_tokens) for the policy, KL and entropy terms alike, so one
batch gives the same gradient however it is bucketed.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_learner_invalid import _model, _traj  # noqa: E402  (pytest puts this folder on sys.path)

from taurl.errors import ConfigError
from taurl.recipe.config import TrainConfig
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.rows import micro_batches


def _batch(model):
    # two groups, rows of 5 to 14 tokens: small micro-batches cut them into several widths
    rows = [([5, 6, 7], [10, 11, 12, 13], 1.0, "g"), ([5, 6, 7], [20, 21], 0.0, "g"),
            ([5, 6, 7, 8, 9, 40, 41], [30, 31, 32, 33, 34, 35, 36], 1.0, "h"),
            ([5, 6, 7, 8, 9, 40, 41], [50, 51], 0.0, "h")]
    return [_traj(model, f"e{i}", p, a, r, g) for i, (p, a, r, g) in enumerate(rows)]


def _grads(model, reference, trajs, micro_batch_tokens, **cfg):
    m = copy.deepcopy(model)
    config = LearnerConfig(
        lr=1e-9, grad_clip=1e9, micro_batch_tokens=micro_batch_tokens,
        aggregation="seq-mean-token-sum-norm", kl_coef=0.5, kl_kind="k2", entropy_coef=0.1, **cfg,
    )
    stats = Learner(m, config, reference=copy.deepcopy(reference)).update(trajs)
    return [p.grad.clone() for p in m.parameters()], stats


@pytest.mark.parametrize(
    "cfg", [{"norm_constant": 16.0}, {"objective_options": {"norm_constant": 16.0}}]
)
def test_the_gradient_of_a_batch_does_not_depend_on_its_length_buckets(cfg):
    model = _model()
    reference = copy.deepcopy(model)
    with torch.no_grad():  # a reference apart from the policy, so the KL term has a gradient
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trajs = _batch(model)
    assert len(micro_batches(trajs, 1000)) == 1 and len(micro_batches(trajs, 20)) > 2
    one, s1 = _grads(model, reference, trajs, 1000, **cfg)
    many, s2 = _grads(model, reference, trajs, 20, **cfg)
    assert s1["learn/kl_k2"] > 0 and s1["learn/rows"] == 4
    assert max(float(g.abs().max()) for g in one) > 1e-4
    for a, b in zip(one, many, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert s1["learn/loss"] == pytest.approx(s2["learn/loss"], rel=1e-5)


def test_train_config_sets_the_generation_budget_as_the_constant():
    cfg = TrainConfig(aggregation="seq-mean-token-sum-norm", max_episode_tokens=96)
    assert cfg.learner_config().norm_constant == 96.0 and cfg.learner_config().problems() == []
    with pytest.raises(ConfigError, match="norm_constant"):
        Learner(_model(), LearnerConfig(aggregation="seq-mean-token-sum-norm"))
    assert LearnerConfig(aggregation="seq-mean-token-sum-norm", norm_constant=0.0).problems()
