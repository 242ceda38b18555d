"""KL (k1/k2/k3, loss and penalty), entropy bonus, DPO, SFT and the value loss, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from taurl.errors import ConfigError
from taurl.train.objectives import (
    dpo_loss,
    entropy_bonus,
    kl_estimate,
    kl_loss,
    kl_reward_penalty,
    sequence_entropy,
    sequence_logprobs,
    sft_loss,
    value_loss,
)

LN2 = math.log(2)


def test_kl_estimators_by_hand():
    # π_θ(a) = 0.5, π_ref(a) = 0.25: log r = log(0.25/0.5) = -ln 2
    # k1 = ln 2 = 0.693147; k2 = ½ ln²2 = 0.240227; k3 = (0.5 - 1) + ln 2 = 0.193147
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(LN2)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * LN2 ** 2)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(LN2 - 0.5)
    with pytest.raises(ConfigError, match="Did you mean 'k3'"):
        kl_estimate(logp, ref, "k4")


def test_k1_and_k3_are_unbiased_monte_carlo():
    # p = [0.7, 0.2, 0.1], q = [0.2, 0.5, 0.3]: KL(p‖q) = Σ p log(p/q) = 0.5798
    p, q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.2, 0.5, 0.3])
    exact = float((p * (p / q).log()).sum())
    x = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    logp, logq = p.log()[x][None], q.log()[x][None]
    for kind in ("k1", "k3"):
        assert kl_estimate(logp, logq, kind).mean().item() == pytest.approx(exact, abs=0.01), kind
    assert kl_estimate(logp, logq, "k3").min() >= 0


def test_kl_loss_masks_and_penalty_is_detached():
    logp = torch.tensor([[math.log(0.5), 0.0]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), float("nan")]])
    mask = torch.tensor([[1, 0]])
    loss, m = kl_loss(logp, ref, mask, kind="k1")
    loss.backward()
    assert loss.item() == pytest.approx(LN2) and m["learn/kl_k1"] == pytest.approx(LN2)
    assert logp.grad.tolist() == [[1.0, 0.0]]  # d k1 / d logp = 1 on the action token only
    pen = kl_reward_penalty(logp, ref, mask, beta=0.1)
    assert not pen.requires_grad and pen[0].tolist() == pytest.approx([-0.1 * LN2, 0.0])


def test_entropy_and_bonus():
    # uniform logits over 4 tokens: H = ln 4 at every predicted position; position 0 has none
    logits = torch.zeros(1, 3, 4, requires_grad=True)
    h = sequence_entropy(logits)
    assert h[0].tolist() == pytest.approx([0.0, math.log(4), math.log(4)])
    loss, m = entropy_bonus(h, torch.tensor([[0, 1, 1]]), coef=0.01)
    assert loss.item() == pytest.approx(-0.01 * math.log(4)) and m[
        "learn/entropy"
    ] == pytest.approx(math.log(4))


def test_sequence_logprobs_align_with_tokens():
    torch.manual_seed(0)
    logits, ids = torch.randn(2, 4, 5), torch.randint(0, 5, (2, 4))
    lp = sequence_logprobs(logits, ids, temperature=0.7)
    want = torch.log_softmax(logits / 0.7, -1)
    for b in range(2):
        assert lp[b, 0] == 0
        for t in range(1, 4):
            assert lp[b, t].item() == pytest.approx(want[b, t - 1, ids[b, t]].item(), abs=1e-6)


def test_dpo_by_hand():
    # chosen: Σ action logp = -1 vs ref -2 -> +1; rejected: -3 vs -2 -> -1; Δ = 2, β = 0.5 -> βΔ = 1
    # loss = -log σ(1) = 0.313262; d loss / d chosen logp = -β σ(-1) = -0.5 · 0.268941 = -0.134471
    # third token: an observation, masked
    c = torch.tensor([[-0.5, -0.5, -99.0]], requires_grad=True)
    c_ref, c_mask = torch.tensor([[-1.0, -1.0, 0.0]]), torch.tensor([[1, 1, 0]])
    r, r_ref, r_mask = torch.tensor([[-3.0]]), torch.tensor([[-2.0]]), torch.tensor([[1]])
    loss, m = dpo_loss(c, c_ref, c_mask, r, r_ref, r_mask, beta=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-1))))
    torch.testing.assert_close(
        c.grad, torch.tensor([[-0.134471, -0.134471, 0.0]]), atol=1e-6, rtol=0
    )
    assert m["learn/dpo_reward_acc"] == 1.0 and m["learn/dpo_margin"] == pytest.approx(2.0)
    # label smoothing ε = 0.1: -(0.9 log σ(1) + 0.1 log σ(-1))
    smooth, _ = dpo_loss(c, c_ref, c_mask, r, r_ref, r_mask, beta=0.5, label_smoothing=0.1)
    sig = 1 / (1 + math.exp(-1))
    assert smooth.item() == pytest.approx(-(0.9 * math.log(sig) + 0.1 * math.log(1 - sig)))


def test_sft_is_nll_of_action_tokens():
    logp = torch.tensor([[-1.0, -3.0, -100.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, m = sft_loss(logp, mask)
    # (1 + 3 + 2) / 3
    assert loss.item() == pytest.approx(2.0) and m["learn/sft_nll"] == pytest.approx(2.0)
    # (2 + 2) / 2
    assert sft_loss(logp, mask, aggregation="seq-mean-token-mean")[0].item() == pytest.approx(2.0)


def test_value_loss_clipping_by_hand():
    # V = 0.5, V_old = 0.3, R = 1, ε = 0.1: (0.5 - 1)² = 0.25; clipped V = 0.4 -> (0.4 - 1)² = 0.36
    # loss = ½ max(0.25, 0.36) = 0.18; gradient 0 (the clipped branch does not depend on V beyond ε)
    v = torch.tensor([[0.5, 7.0]], requires_grad=True)
    loss, m = value_loss(
        v, torch.tensor([[0.3, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[1, 0]]), clip=0.1
    )
    loss.backward()
    assert (
        loss.item() == pytest.approx(0.18)
        and m["learn/vf_clip_frac"] == 1.0
        and v.grad.tolist() == [[0.0, 0.0]]
    )
    # unclipped: ½ (0.5 - 1)² = 0.125, gradient V - R = -0.5
    v.grad = None
    loss, _ = value_loss(
        v, torch.tensor([[0.3, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[1, 0]]), clip=None
    )
    loss.backward()
    assert loss.item() == pytest.approx(0.125) and v.grad.tolist() == [[-0.5, 0.0]]
