"""GSPO: group sequence policy optimization (Zheng et al., arXiv 2507.18071).

The importance ratio is taken per sequence, length-normalized (a geometric mean of token
ratios), and clipped per sequence:

    s_i(θ)   = exp( (1/|y_i|) Σ_t log π_θ(y_{i,t}) / π_old(y_{i,t}) )            (§4.1)
    s_{i,t}  = sg[s_i(θ)] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]                      (GSPO-token, §4.3)
    ℓ_{i,t}  = max(−A_{i,t} s_{i,t}, −A_{i,t} clip(s_{i,t}, 1 − ε_low, 1 + ε_high))

s_{i,t} equals s_i in value, so every token of a sequence is clipped together; its gradient
is the sequence one when A is constant over the sequence, and it admits per-token
advantages — which multi-turn credit produces (one advantage per turn). We always use this
GSPO-token form. |y_i| counts the action tokens of the sequence (mask 1); with
``traj_index`` a sequence is a whole trajectory spread over several rows.
Default ε are the paper's (3e-4, 4e-4); aggregation defaults to seq-mean-token-mean (§4.1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from taurl.train.objectives.aggregation import aggregate, check_aggregation, masked, sequence_sums
from taurl.train.objectives.ppo import Metrics, check_clip, clipped_surrogate, surrogate_metrics


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor,
                       traj_index: Tensor | None = None) -> Tensor:
    """(B,) log s_i of each row's sequence: the mean token log-ratio over its action tokens."""
    log_ratio = masked(logprobs - old_logprobs, mask)
    seq_sum, seq_count, row_seq = sequence_sums(log_ratio, mask, traj_index)
    return (seq_sum / seq_count.clamp(min=1))[row_seq]


def gspo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
              eps_low: float = 3e-4, eps_high: float = 4e-4,
              aggregation: str = "seq-mean-token-mean",
              traj_index: Tensor | None = None, norm_constant: float | None = None,
              denominator: float | None = None) -> tuple[Tensor, Metrics]:
    """GSPO(-token) loss, shapes as `ppo_clip_loss`. Returns (loss, metrics)."""
    check_clip(eps_low, eps_high, None)
    check_aggregation(aggregation)
    seq_log = sequence_log_ratio(logprobs, old_logprobs.detach(), mask, traj_index)  # (B,)
    token_log_s = seq_log.detach()[:, None] + logprobs - logprobs.detach()
    log_s = masked(token_log_s, mask)
    ratio = torch.exp(log_s)
    adv = masked(advantages.detach().to(logprobs.dtype), mask)
    loss_tok, flags = clipped_surrogate(ratio, adv, eps_low, eps_high, None)
    loss = aggregate(loss_tok, mask, aggregation, traj_index=traj_index,
                     norm_constant=norm_constant, denominator=denominator)
    metrics = surrogate_metrics(loss_tok, ratio, masked(logprobs - old_logprobs, mask).detach(),
                                flags, mask)
    return loss, {"learn/pg_loss": float(loss.detach()), **metrics}
