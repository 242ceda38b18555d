"""Gradients flow only through action tokens: a tiny Qwen2 (random init, no download).

The logits at position p score token p+1 (`sequence_logprobs`). For every objective, the
gradient on the logits that score prompt / observation / template tokens (mask 0) must be
exactly zero, perturbing those logits must leave the loss bit-identical, and the logits
that score action tokens must get a gradient.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from taurl.credit import broadcast_to_tokens, token_turn_index
from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn, validate_trajectory
from taurl.train.objectives import (
    ValueModel,
    decoupled_ppo_loss,
    dpo_loss,
    dual_clip_ppo_loss,
    entropy_bonus,
    gspo_loss,
    kl_loss,
    ppo_clip_loss,
    sequence_entropy,
    sequence_logprobs,
    sft_loss,
)


def tiny_qwen() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg).eval()


def trajectory() -> Trajectory:
    """prompt 5 | action 4 | observation 6 | action 3 | template 1 (all ids < 64)."""
    segs = (
        Segment("prompt", (1, 2, 3, 4, 5)),
        Segment("action", (20, 21, 22, 23), (-1.0,) * 4, 0),
        Segment("observation", (40, 41, 42, 43, 44, 45)),
        Segment("action", (24, 25, 26), (-1.0,) * 3, 0),
        Segment("template", (6,)),
    )
    turns = (
        Turn(0, "q", {"kind": "search"}, "obs", 1, 2, "stop"),
        Turn(1, "a", {"kind": "answer"}, "", 3, None, "stop"),
    )
    return validate_trajectory(
        Trajectory(
            episode_id="e", run_id="r", task_id="t", group_id="t", split="train",
            env_name="search-v0", env_version="1", seed=0, segments=segs, turns=turns,
            messages=({"role": "user", "content": "x"},), terminated=True, truncated=False,
            stop_reason=StopReason.ANSWERED, reward=1.0,
        )
    )


TRAJ = trajectory()
IDS = torch.tensor([TRAJ.token_ids])
MASK = torch.tensor([TRAJ.action_mask])
ADV = torch.from_numpy(broadcast_to_tokens([0.7, -1.3], token_turn_index(TRAJ))).float()[None]
# logits row p scores token p+1: rows scoring a mask-0 token, plus the last row (scores nothing)
SCORES_ACTION = torch.zeros(IDS.shape[1], dtype=torch.bool)
SCORES_ACTION[:-1] = MASK[0, 1:].bool()


def objectives(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    logp = sequence_logprobs(logits, IDS)
    g = torch.Generator().manual_seed(1)
    old = (logp.detach() + 0.02 * torch.randn(logp.shape, generator=g)).clamp(max=0)
    behaviour = old - 0.05 * torch.rand(logp.shape, generator=g)
    return {
        "ppo": ppo_clip_loss(logp, old, ADV, MASK)[0],
        "dual_clip_ppo": dual_clip_ppo_loss(logp, old, ADV, MASK)[0],
        "gspo": gspo_loss(logp, old, ADV, MASK, eps_low=0.2, eps_high=0.2)[0],
        "decoupled_ppo": decoupled_ppo_loss(logp, old, ADV, MASK, behaviour_logprobs=behaviour,
                                            is_level="geometric")[0],
        "sft": sft_loss(logp, MASK)[0],
        "kl_k3": kl_loss(logp, old - 0.1, MASK, kind="k3")[0],
        "entropy": entropy_bonus(sequence_entropy(logits), MASK)[0],
        "dpo": dpo_loss(logp, old - 0.3, MASK, old, old, MASK, beta=0.1)[0],
    }


@pytest.fixture(scope="module")
def logits() -> torch.Tensor:
    with torch.no_grad():
        return tiny_qwen()(IDS).logits.float()


@pytest.mark.parametrize(
    "name", ["ppo", "dual_clip_ppo", "gspo", "decoupled_ppo", "sft", "kl_k3", "entropy", "dpo"]
)
def test_gradient_only_on_logits_that_score_action_tokens(logits, name):
    leaf = logits.clone().requires_grad_()
    loss = objectives(leaf)[name]
    (grad,) = torch.autograd.grad(loss, leaf)
    assert torch.all(grad[0, ~SCORES_ACTION] == 0), "a mask-0 token's logits got a gradient"
    assert torch.all(grad[0, SCORES_ACTION].abs().sum(-1) > 0), (
        "an action token's logits got no gradient"
    )
    # perturbing the logits that score prompt / observation / template tokens changes nothing
    noisy = logits.clone()
    noisy[0, ~SCORES_ACTION] += 5.0 * torch.randn_like(noisy[0, ~SCORES_ACTION])
    assert torch.equal(objectives(noisy)[name].detach(), loss.detach())


def test_gradient_reaches_the_model_parameters():
    model = tiny_qwen()
    logp = sequence_logprobs(model(IDS).logits, IDS)
    loss, _ = ppo_clip_loss(logp, torch.full(IDS.shape, -4.0), ADV, MASK)
    loss.backward()
    grads = [p.grad.abs().sum().item() for p in model.parameters() if p.grad is not None]
    assert grads and sum(grads) > 0


def test_value_model_on_the_tiny_backbone():
    vm = ValueModel(tiny_qwen())
    values = vm(IDS)
    assert values.shape == IDS.shape and torch.all(values == 0)  # the head starts at zero
    values.sum().backward()
    assert vm.head.weight.grad.abs().sum() > 0
