"""PPO clip (asymmetric, dual), GSPO and decoupled off-policy PPO: numbers and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from taurl.errors import ConfigError
from taurl.train.objectives import (
    decoupled_ppo_loss,
    dual_clip_ppo_loss,
    gspo_loss,
    importance_weights,
    ppo_clip_loss,
)

LN = math.log


def one(ratio: float, adv: float, **kw):
    """PPO loss of a single token with the given ratio and advantage, and d loss / d logp."""
    logp = torch.tensor([[LN(ratio)]], requires_grad=True)
    loss, metrics = ppo_clip_loss(
        logp, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1), **kw
    )
    loss.backward()
    return loss.item(), logp.grad.item(), metrics


def test_clipped_surrogate_by_hand():
    # ρ = 1.5, A = +1, ε = 0.2: max(-1.5, -1.2) = -1.2, clipped: no gradient
    loss, grad, m = one(1.5, 1.0)
    assert loss == pytest.approx(-1.2) and grad == 0.0 and m["learn/clip_frac_high"] == 1.0
    # ρ = 0.5, A = -1: max(0.5, 0.8) = 0.8, clipped low
    loss, grad, m = one(0.5, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0 and m["learn/clip_frac_low"] == 1.0
    # ρ = 1.1, A = +1: inside the range, -ρA; d/dlogp (-A·e^logp) = -ρA = -1.1
    loss, grad, m = one(1.1, 1.0)
    assert (
        loss == pytest.approx(-1.1) and grad == pytest.approx(-1.1) and m["learn/clip_frac"] == 0.0
    )
    # ρ = 0.5, A = +1: the pessimistic (unclipped) term -0.5 is the max -> gradient flows (-0.5)
    loss, grad, _ = one(0.5, 1.0)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5)


def test_asymmetric_clip_higher():
    # ρ = 1.25, A = +1: clipped to 1.2 with ε_high = 0.2, free with ε_high = 0.28
    assert one(1.25, 1.0)[0] == pytest.approx(-1.2)
    loss, grad, _ = one(1.25, 1.0, eps_low=0.2, eps_high=0.28)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25)


def test_dual_clip_bounds_negative_advantages():
    # ρ = 3.5, A = -1: PPO max(3.5, 1.2) = 3.5; dual clip c = 3 -> min(3.5, 3) = 3, no gradient
    assert one(3.5, -1.0)[0] == pytest.approx(3.5)
    logp = torch.tensor([[LN(3.5), LN(3.5)]], requires_grad=True)
    loss, m = dual_clip_ppo_loss(
        logp, torch.zeros(1, 2), torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2), dual_clip=3.0
    )
    # token 2 (A = +1, ρ = 3.5) is clipped high at -1.2; token-mean of (3, -1.2) = 0.9
    assert loss.item() == pytest.approx(0.9) and m["learn/dual_clip_frac"] == 0.5
    with pytest.raises(ConfigError, match="dual_clip"):
        one(1.0, 1.0, dual_clip=0.5)


def test_masked_garbage_never_reaches_loss_or_gradient():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.0, float("-inf"), float("nan")]])
    adv = torch.tensor([[1.0, float("nan"), 5.0]])
    mask = torch.tensor([[1, 0, 0]])
    for fn in (ppo_clip_loss, gspo_loss):
        logp.grad = None
        loss, _ = fn(logp, old, adv, mask)
        loss.backward()
        assert (
            torch.isfinite(loss)
            and logp.grad[0, 1] == 0
            and logp.grad[0, 2] == 0
            and logp.grad[0, 0] != 0
        )


def ref_ppo(logp, old, adv, mask, lo, hi):
    total, count = 0.0, 0
    for lp_row, old_row, adv_row, m_row in zip(logp, old, adv, mask, strict=True):
        for lp, o, a, m in zip(lp_row, old_row, adv_row, m_row, strict=True):
            if m:
                r = math.exp(lp - o)
                total += max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
                count += 1
    return total / count


def test_ppo_matches_loop_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    logp, old = -torch.rand(5, 8, generator=g), -torch.rand(5, 8, generator=g)
    adv, mask = torch.randn(5, 8, generator=g), torch.rand(5, 8, generator=g) < 0.6
    loss, _ = ppo_clip_loss(logp, old, adv, mask, eps_low=0.1, eps_high=0.3)
    assert loss.item() == pytest.approx(
        ref_ppo(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.1, 0.3), rel=1e-5
    )


# --- GSPO ------------------------------------------------------------------------------


def test_gspo_sequence_ratio_by_hand():
    # token log-ratios [0.2, -0.1] (third token masked): s = exp(mean) = exp(0.05) = 1.051271
    logp = torch.tensor([[0.2, -0.1, 9.0]], requires_grad=True)
    old, adv, mask = torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[1, 1, 0]])
    # paper's ε (3e-4, 4e-4): clipped at 1.0004 -> loss -1.0004, no gradient
    loss, m = gspo_loss(logp, old, adv, mask)
    loss.backward()
    assert (
        loss.item() == pytest.approx(-1.0004)
        and torch.all(logp.grad == 0)
        and m["learn/clip_frac"] == 1.0
    )
    # wide ε: loss -s; gradient of the sequence form -A·exp(mean log ρ) is -s/|y| per token
    logp.grad = None
    loss, _ = gspo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    loss.backward()
    s = math.exp(0.05)
    assert loss.item() == pytest.approx(-s, rel=1e-6)
    torch.testing.assert_close(logp.grad, torch.tensor([[-s / 2, -s / 2, 0.0]]))


def test_gspo_pools_rows_of_one_trajectory():
    # two rows of one trajectory: log-ratios 0.2 and -0.1 -> one ratio exp(0.05) for both rows
    logp = torch.tensor([[0.2], [-0.1]])
    loss, _ = gspo_loss(
        logp, torch.zeros(2, 1), torch.ones(2, 1), torch.ones(2, 1), eps_low=0.2, eps_high=0.2,
        traj_index=torch.tensor([0, 0]),
    )
    assert loss.item() == pytest.approx(-math.exp(0.05), rel=1e-6)
    per_row, _ = gspo_loss(
        logp, torch.zeros(2, 1), torch.ones(2, 1), torch.ones(2, 1), eps_low=0.2, eps_high=0.2
    )
    # per row: exp(0.2) = 1.221 is clipped to 1.2, exp(-0.1) = 0.905 is not
    assert per_row.item() == pytest.approx(-(1.2 + math.exp(-0.1)) / 2, rel=1e-6)


# --- decoupled PPO ---------------------------------------------------------------------


def test_decoupled_equals_ppo_when_behaviour_is_proximal():
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(3, 6, generator=g)).requires_grad_()
    old, adv, mask = (
        -torch.rand(3, 6, generator=g),
        torch.randn(3, 6, generator=g),
        torch.rand(3, 6, generator=g) < 0.7,
    )
    a, _ = ppo_clip_loss(logp, old, adv, mask)
    (ga,) = torch.autograd.grad(a, logp)
    b, m = decoupled_ppo_loss(logp, old, adv, mask, behaviour_logprobs=old)
    (gb,) = torch.autograd.grad(b, logp)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, gb)
    assert m["learn/is_weight_mean"] == pytest.approx(1.0) and m[
        "learn/behaviour_kl"
    ] == pytest.approx(0.0)


def test_importance_weight_levels_and_modes_by_hand():
    # π_prox/μ per token = 1.5 on both action tokens (log 1.5), third token masked
    prox = torch.tensor([[LN(1.5), LN(1.5), 5.0]])
    behav = torch.zeros(1, 3)
    mask = torch.tensor([[1, 1, 0]])

    def w(**kw):
        return importance_weights(prox, behav, mask, **kw)[0][0].tolist()

    assert w(level="token") == pytest.approx([1.5, 1.5, 0])
    assert w(level="sequence") == pytest.approx([2.0, 2.0, 0])  # 1.5² = 2.25, truncated at 2
    assert w(level="sequence", cap=3.0) == pytest.approx([2.25, 2.25, 0])
    assert w(level="geometric") == pytest.approx([1.5, 1.5, 0])  # sqrt(2.25)
    # 2.25 > 2: whole sequence dropped
    assert w(level="sequence", mode="mask") == pytest.approx([0, 0, 0])
    # below the floor
    assert w(level="token", mode="mask", floor=1.6, cap=4.0) == pytest.approx([0, 0, 0])
    assert w(level="token", mode="truncate", cap=1.2) == pytest.approx([1.2, 1.2, 0])
    _, m = importance_weights(prox, behav, mask, level="sequence")
    assert m["learn/is_bounded_frac"] == 1.0


def test_importance_weights_match_loop():
    g = torch.Generator().manual_seed(2)
    prox, behav = -torch.rand(4, 5, generator=g), -torch.rand(4, 5, generator=g)
    mask = torch.rand(4, 5, generator=g) < 0.7
    for level in ("token", "sequence", "geometric"):
        got = importance_weights(prox, behav, mask, level=level, cap=1.3)[0]
        for i in range(4):
            logs = [float(prox[i, t] - behav[i, t]) for t in range(5) if mask[i, t]]
            for t in range(5):
                if not mask[i, t]:
                    assert got[i, t] == 0
                    continue
                lw = {"token": float(prox[i, t] - behav[i, t]), "sequence": sum(logs),
                      "geometric": sum(logs) / len(logs)}[level]
                assert got[i, t].item() == pytest.approx(min(math.exp(lw), 1.3), rel=1e-5)


def test_decoupled_weights_scale_the_loss_and_need_valid_options():
    # one token, ρ = 1 against the proximal policy, A = 1 -> PPO loss -1; w = 1.5 -> -1.5
    logp = torch.zeros(1, 1, requires_grad=True)
    loss, _ = decoupled_ppo_loss(logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                 behaviour_logprobs=torch.full((1, 1), -LN(1.5)))
    assert loss.item() == pytest.approx(-1.5)
    with pytest.raises(ConfigError, match="Did you mean 'geometric'"):
        decoupled_ppo_loss(logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                           behaviour_logprobs=torch.zeros(1, 1), is_level="geometrc")
