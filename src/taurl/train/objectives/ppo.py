"""PPO's clipped surrogate, with asymmetric clipping and dual clipping.

    ρ_t = π_θ(a_t) / π_old(a_t)
    ℓ_t = max(−A_t ρ_t, −A_t clip(ρ_t, 1 − ε_low, 1 + ε_high))            (PPO, arXiv 1707.06347
                                                                          Eq. 7)
    dual clip, A_t < 0:  ℓ_t = min(ℓ_t, −c·A_t),  c > 1                   (arXiv 1912.09729)

ε_high > ε_low ("clip-higher") lets unlikely tokens grow and keeps entropy up
(DAPO, arXiv 2503.14476 §3.1). Dual clip bounds the loss of a negative-advantage token whose
ratio has exploded (stale or off-policy data). All inputs are (B, L); only tokens with
mask 1 (action tokens) count, and off the mask nothing — not even NaN — reaches the loss or
its gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from taurl.errors import ConfigError
from taurl.train.objectives.aggregation import aggregate, check_aggregation, masked, masked_mean

Metrics = dict[str, float]


def check_clip(eps_low: float, eps_high: float, dual_clip: float | None) -> None:
    problems = []
    if not 0 < eps_low < 1:
        problems.append(f"eps_low must be in (0, 1), got {eps_low!r}")
    if not eps_high > 0:
        problems.append(f"eps_high must be > 0, got {eps_high!r}")
    if dual_clip is not None and not dual_clip > 1:
        problems.append(f"dual_clip must be > 1 (or None), got {dual_clip!r}")
    if problems:
        raise ConfigError(problems)


def clipped_surrogate(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float,
                      dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token loss ℓ_t (B, L) and boolean flags of where each clip is active."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    flags = {
        "low": (ratio < 1.0 - eps_low) & (advantages < 0),
        "high": (ratio > 1.0 + eps_high) & (advantages > 0),
    }
    if dual_clip is not None:
        bound = -dual_clip * advantages
        flags["dual"] = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    return loss, flags


def surrogate_metrics(loss_tok: Tensor, ratio: Tensor, log_ratio: Tensor, flags: dict[str, Tensor],
                      mask: Tensor) -> Metrics:
    """Clip fractions, ratio range and approx KL(π_old ‖ π_θ) (k3) over the masked tokens."""
    with torch.no_grad():
        m = mask.bool()
        out = {
            "learn/clip_frac": float(masked_mean((flags["low"] | flags["high"]).float(), m)),
            "learn/clip_frac_low": float(masked_mean(flags["low"].float(), m)),
            "learn/clip_frac_high": float(masked_mean(flags["high"].float(), m)),
            "learn/approx_kl": float(masked_mean(torch.expm1(log_ratio) - log_ratio, m)),
            "learn/ratio_mean": float(masked_mean(ratio, m)),
            "learn/ratio_max": float(masked(ratio, m).max()) if m.any() else 1.0,
        }
        if "dual" in flags:
            out["learn/dual_clip_frac"] = float(masked_mean(flags["dual"].float(), m))
        return out


def ppo_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                  eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None,
                  aggregation: str = "token-mean", traj_index: Tensor | None = None,
                  norm_constant: float | None = None,
                  denominator: float | None = None) -> tuple[Tensor, Metrics]:
    """PPO clipped surrogate (module docstring) aggregated with `aggregation`.

    logprobs: (B, L) log π_θ, with grad. old_logprobs: (B, L) log π_old (the policy the
    ratio is taken against; no grad). advantages: (B, L) per-token (broadcast from turns).
    mask: (B, L) 1 on action tokens. Returns (loss, metrics).
    """
    check_clip(eps_low, eps_high, dual_clip)
    check_aggregation(aggregation)
    log_ratio = masked(logprobs - old_logprobs.detach(), mask)
    ratio = torch.exp(log_ratio)
    adv = masked(advantages.detach().to(logprobs.dtype), mask)
    loss_tok, flags = clipped_surrogate(ratio, adv, eps_low, eps_high, dual_clip)
    loss = aggregate(loss_tok, mask, aggregation, traj_index=traj_index,
                     norm_constant=norm_constant, denominator=denominator)
    return loss, {"learn/pg_loss": float(loss.detach()),
                  **surrogate_metrics(loss_tok, ratio, log_ratio, flags, mask)}


def dual_clip_ppo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                       eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float = 3.0,
                       aggregation: str = "token-mean", traj_index: Tensor | None = None,
                       norm_constant: float | None = None,
                       denominator: float | None = None) -> tuple[Tensor, Metrics]:
    """`ppo_clip_loss` with dual clipping on (c = 3 by default, as in arXiv 1912.09729)."""
    return ppo_clip_loss(logprobs, old_logprobs, advantages, mask, eps_low=eps_low,
                         eps_high=eps_high,
                         dual_clip=dual_clip, aggregation=aggregation, traj_index=traj_index,
                         norm_constant=norm_constant, denominator=denominator)
