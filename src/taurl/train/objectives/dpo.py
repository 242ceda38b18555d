"""Trajectory-pair DPO over action tokens only.

DPO (Rafailov et al., arXiv 2305.18290, Eq. 7) on whole trajectories: for a pair of
trajectories of one task, chosen (w) and rejected (l),

    log π(τ) = Σ_t m_t log π(a_t | ·)          over action tokens only (mask m)
    Δ        = [log π_θ(τ_w) − log π_ref(τ_w)] − [log π_θ(τ_l) − log π_ref(τ_l)]
    loss     = −(1 − ε) log σ(β Δ) − ε log σ(−β Δ)

ε (label smoothing) is conservative DPO (cDPO); ε = 0 is the paper's loss. Observation
tokens are the environment's, not the policy's, so they take no part in log π(τ).
Pairs come from `taurl.credit.filters.preference_pairs`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from taurl.errors import ConfigError
from taurl.train.objectives.aggregation import masked

Metrics = dict[str, float]


def dpo_loss(chosen_logprobs: Tensor, chosen_ref_logprobs: Tensor, chosen_mask: Tensor,
             rejected_logprobs: Tensor, rejected_ref_logprobs: Tensor, rejected_mask: Tensor, *,
             beta: float = 0.1, label_smoothing: float = 0.0) -> tuple[Tensor, Metrics]:
    """Trajectory-pair DPO loss, mean over the P pairs.

    Each argument is (P, L): row p of the chosen tensors and row p of the rejected ones
    form pair p (L may differ between the two sides). Returns (loss, metrics).
    """
    if not beta > 0:
        raise ConfigError(f"DPO beta must be > 0, got {beta!r}")
    if not 0 <= label_smoothing < 0.5:
        raise ConfigError(f"DPO label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
    if chosen_logprobs.shape[0] != rejected_logprobs.shape[0]:
        raise ConfigError("DPO needs as many chosen as rejected rows, got "
                          f"{chosen_logprobs.shape[0]} and {rejected_logprobs.shape[0]}")
    chosen = masked(chosen_logprobs - chosen_ref_logprobs.detach(), chosen_mask).sum(-1)
    rejected = masked(rejected_logprobs - rejected_ref_logprobs.detach(), rejected_mask).sum(-1)
    logits = beta * (chosen - rejected)
    losses = -(1 - label_smoothing) * torch.nn.functional.logsigmoid(logits) \
        - label_smoothing * torch.nn.functional.logsigmoid(-logits)
    loss = losses.mean() if losses.numel() else logits.sum() * 0.0
    with torch.no_grad():
        metrics = {
            "learn/dpo_loss": float(loss.detach()),
            "learn/dpo_reward_acc": float((logits > 0).float().mean()) if logits.numel() else 0.0,
            "learn/dpo_margin": float((logits / beta).mean()) if logits.numel() else 0.0,
            "learn/dpo_chosen_reward": float((beta * chosen).mean()) if logits.numel() else 0.0,
            "learn/dpo_rejected_reward": float((beta * rejected).mean()) if logits.numel() else 0.0,
        }
    return loss, metrics
