"""The built-in losses of ``forward_backward``, as pure functions of per-token tensors.

Every loss is a sum over the datum's tokens (no mean: Tinker's convention, so the loss of a
batch is the sum of its datums' and gradients accumulate across calls until ``optim_step``).
`lp` is the learner's log π_θ(target_t | x_<t), shape (N,) (or (N, K) for top-K
cross-entropy). Formulas as Tinker documents them (tinker-docs "Loss Functions"):

- cross_entropy:        L = −Σ_t w_t · lp_t          (weights omitted: all ones)
- importance_sampling:  L = −Σ_t exp(lp_t − q_t) · A_t        (q: the sampler's logprobs)
- ppo:                  L = −Σ_t min(r_t A_t, clip(r_t, lo, hi) A_t),  r_t = exp(lp_t − q_t)
  (Schulman et al. 2017; lo, hi = `clip_low_threshold`, `clip_high_threshold`, 0.8 and 1.2)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class LossSpec:
    """What a loss reads from ``Datum.loss_fn_inputs`` and which config keys it takes."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    config: tuple[str, ...] = ()


LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(("target_tokens",), ("weights",)),
    "importance_sampling": LossSpec(("target_tokens", "logprobs", "advantages"), ("weights",)),
    "ppo": LossSpec(("target_tokens", "logprobs", "advantages"), ("weights",),
                    ("clip_low_threshold", "clip_high_threshold")),
}


def cross_entropy(lp: Tensor, weights: Tensor | None) -> Tensor:
    """−Σ w · lp (w: ones when the datum has no ``weights``)."""
    return -(lp * weights).sum() if weights is not None else -lp.sum()


def importance_sampling(lp: Tensor, sampling_lp: Tensor, advantages: Tensor) -> Tensor:
    """−Σ exp(lp − q) · A: the REINFORCE surrogate, off-policy corrected by the ratio."""
    return -(torch.exp(lp - sampling_lp) * advantages).sum()


def ppo(lp: Tensor, sampling_lp: Tensor, advantages: Tensor, low: float = 0.8,
        high: float = 1.2) -> Tensor:
    """−Σ min(r A, clip(r, low, high) A), r = exp(lp − q) (the clipped PPO objective)."""
    ratio = torch.exp(lp - sampling_lp)
    return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages).sum()


def datum_loss(loss_fn: str, lp: Tensor, inputs: dict[str, Tensor],
               config: dict[str, float | str]) -> Tensor:
    """The loss `loss_fn` of one datum from its learner logprobs and loss inputs."""
    if loss_fn == "cross_entropy":
        return cross_entropy(lp, inputs.get("weights"))
    if loss_fn == "importance_sampling":
        return importance_sampling(lp, inputs["logprobs"], inputs["advantages"])
    if loss_fn == "ppo":
        return ppo(lp, inputs["logprobs"], inputs["advantages"],
                   float(config.get("clip_low_threshold", 0.8)),
                   float(config.get("clip_high_threshold", 1.2)))
    raise ValueError(f"unknown loss {loss_fn!r}")
