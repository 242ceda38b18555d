"""Rejection-sampling SFT (RFT; Yuan et al., arXiv 2308.01825) over action tokens only.

Keep the trajectories that pass (`taurl.credit.filters.rejection_sampling`) and minimize
−log π_θ over their action tokens; prompt and observation tokens are masked out exactly as
in the RL losses.
"""

from __future__ import annotations

from torch import Tensor

from taurl.train.objectives.aggregation import aggregate, check_aggregation, masked, masked_mean

Metrics = dict[str, float]


def sft_loss(logprobs: Tensor, mask: Tensor, *, aggregation: str = "token-mean",
             traj_index: Tensor | None = None, norm_constant: float | None = None,
             denominator: float | None = None) -> tuple[Tensor, Metrics]:
    """Negative log-likelihood of the action tokens (B, L) -> scalar; rejection-sampling SFT."""
    check_aggregation(aggregation)
    nll = masked(-logprobs, mask)
    loss = aggregate(nll, mask, aggregation, traj_index=traj_index, norm_constant=norm_constant,
                     denominator=denominator)
    return loss, {"learn/sft_nll": float(masked_mean(nll.detach(), mask))}
