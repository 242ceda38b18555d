"""KL to a reference policy (as a loss term or a reward penalty) and the entropy bonus.

Per-token estimators of KL(π_θ ‖ π_ref) from tokens sampled by π_θ, with
log r_t = log π_ref(a_t) − log π_θ(a_t) (Schulman, "Approximating KL Divergence", 2020):

    k1 = −log r                 unbiased, high variance, can be negative
    k2 = ½ (log r)²             biased; as a *loss* its gradient is the true KL gradient
    k3 = (r − 1) − log r        unbiased, always ≥ 0 (GRPO's KL term, arXiv 2402.03300 Eq. 4)

As a loss (``kl_loss``) the gradient flows through log π_θ; which estimator gives which
gradient is analysed in arXiv 2506.09477 (k2 as a loss is the on-policy-correct one). As a
reward penalty (``kl_reward_penalty``, the InstructGPT form, arXiv 2203.02155 Eq. 2) the
value is detached and subtracted from the rewards: k1 summed over a turn's tokens
(`taurl.credit.tokens.turn_sums`) is the per-turn penalty.
log r is clamped to [−20, 20] before k3's exp so one bad token cannot overflow.
"""

from __future__ import annotations

import torch
from torch import Tensor

from taurl.credit.registry import did_you_mean
from taurl.errors import ConfigError
from taurl.train.objectives.aggregation import aggregate, check_aggregation, masked, masked_mean

KL_ESTIMATORS = ("k1", "k2", "k3")
Metrics = dict[str, float]


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate (B, L) with estimator `kind` (unmasked)."""
    if kind not in KL_ESTIMATORS:
        raise ConfigError("unknown KL estimator "
                          f"{kind!r}.{did_you_mean(kind, list(KL_ESTIMATORS))} One of: "
                          f"{', '.join(KL_ESTIMATORS)}")
    log_r = ref_logprobs - logprobs
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r * log_r
    log_r = torch.clamp(log_r, -20.0, 20.0)
    return torch.expm1(log_r) - log_r


def kl_loss(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, *, kind: str = "k3",
            aggregation: str = "token-mean", traj_index: Tensor | None = None,
            norm_constant: float | None = None,
            denominator: float | None = None) -> tuple[Tensor, Metrics]:
    """KL(π_θ ‖ π_ref) as a loss term over action tokens; multiply by β in the learner.

    logprobs (B, L) with grad, ref_logprobs (B, L), mask (B, L). Returns (loss, metrics).
    """
    check_aggregation(aggregation)
    per_tok = masked(kl_estimate(logprobs, ref_logprobs.detach(), kind), mask)
    loss = aggregate(per_tok, mask, aggregation, traj_index=traj_index, norm_constant=norm_constant,
                     denominator=denominator)
    return loss, {f"learn/kl_{kind}": float(masked_mean(per_tok.detach(), mask))}


def kl_reward_penalty(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, *, beta: float,
                      kind: str = "k1") -> Tensor:
    """Per-token rewards −β·KL_t (B, L), detached, 0 off the mask: KL as a reward penalty."""
    if beta < 0:
        raise ConfigError(f"KL penalty beta must be >= 0, got {beta!r}")
    with torch.no_grad():
        return masked(-beta * kl_estimate(logprobs, ref_logprobs, kind), mask)


def entropy_bonus(entropy: Tensor, mask: Tensor, *, coef: float = 0.01,
                  aggregation: str = "token-mean",
                  traj_index: Tensor | None = None, norm_constant: float | None = None,
                  denominator: float | None = None) -> tuple[Tensor, Metrics]:
    """loss = −coef · agg(H_t): maximizing the policy entropy on action tokens.

    entropy: (B, L) from `taurl.policy.logits.sequence_entropy` (with grad).
    Source: Williams & Peng 1991; the PPO objective's S term, arXiv 1707.06347 Eq. 9.
    """
    check_aggregation(aggregation)
    h = aggregate(masked(entropy, mask), mask, aggregation, traj_index=traj_index,
                  norm_constant=norm_constant, denominator=denominator)
    return -coef * h, {"learn/entropy": float(masked_mean(entropy.detach(), mask))}
