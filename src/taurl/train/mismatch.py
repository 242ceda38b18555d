"""Learner-vs-behaviour logprob mismatch over action tokens (pure; one call per update).

With the same weights, the learner's recomputed logprobs should equal the behaviour
logprobs the engine recorded (fp32, CPU: |diff| <= 1e-4). Drift between the trainer and
the inference engine (another kernel, dtype or a stale reload) biases every importance
ratio silently; these numbers make it visible, at the first epoch of each update where
the learner's weights are still the behaviour policy's.

Definitions, over the action tokens t (mask = 1), with d_t = learner_t - behaviour_t:
- abs_mean = mean_t |d_t|, abs_max = max_t |d_t|;
- kl = mean_t (exp(-d_t) - 1 + d_t): the k3 estimator of KL(behaviour || learner) from
  samples of the behaviour policy (Schulman 2020, "Approximating KL Divergence",
  http://joschu.net/blog/kl-approx.html); >= 0 per token, unbiased;
- clip_share = share of t with ratio r_t = exp(d_t) outside [1 - eps_low, 1 + eps_high]
  (the PPO clip range, Schulman et al. 2017).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from taurl.errors import Error


@dataclass(frozen=True)
class Mismatch:
    abs_mean: float
    abs_max: float
    kl: float
    clip_share: float
    tokens: int

    def as_stats(self, prefix: str = "mismatch/") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in self.__dict__.items()}

    def alarms(self, abs_mean_max: float = 1e-3, abs_max_max: float = 1e-2) -> list[str]:
        """What passes its threshold, said as a sentence each (empty: all well)."""
        out = []
        if self.abs_mean > abs_mean_max:
            out.append(f"learner-vs-behaviour logprob |diff| mean {self.abs_mean:.2e} > "
                       f"{abs_mean_max:g}")
        if self.abs_max > abs_max_max:
            out.append(f"learner-vs-behaviour logprob |diff| max {self.abs_max:.2e} > "
                       f"{abs_max_max:g}")
        return out


def logprob_mismatch(learner: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, *,
                     clip_low: float = 0.2, clip_high: float = 0.2) -> Mismatch:
    """`Mismatch` of `learner` vs `behaviour` logprobs over `mask` (module docstring).

    learner, behaviour, mask: same shape (any); mask is 1 on action tokens. No action
    token gives zeros with tokens = 0.
    """
    if learner.shape != behaviour.shape or learner.shape != mask.shape:
        raise Error(f"shapes differ: learner {tuple(learner.shape)}, behaviour "
                    f"{tuple(behaviour.shape)}, mask {tuple(mask.shape)}")
    m = mask.bool()
    d = (learner.detach().double() - behaviour.detach().double())[m]
    if d.numel() == 0:
        return Mismatch(0.0, 0.0, 0.0, 0.0, 0)
    if not torch.isfinite(d).all():
        raise Error("non-finite logprobs on action tokens; a behaviour logprob of -inf means the "
                    "engine sampled a token the policy gives probability 0 (top-p/top-k "
                    "renormalized?)")
    ratio = d.exp()
    outside = (ratio < 1 - clip_low) | (ratio > 1 + clip_high)
    kl = (torch.exp(-d) - 1 + d).mean()
    return Mismatch(abs_mean=float(d.abs().mean()), abs_max=float(d.abs().max()), kl=float(kl),
                    clip_share=float(outside.double().mean()), tokens=int(d.numel()))


__all__ = ["Mismatch", "logprob_mismatch", "tis_stats", "tis_weights"]


def combine_mismatch(parts: list[Mismatch]) -> Mismatch:
    """One `Mismatch` over several micro-batches: token-weighted means, the max of maxima.

    >>> a, b = Mismatch(1e-6, 2e-6, 0.0, 0.0, 10), Mismatch(4e-6, 9e-6, 0.0, 0.5, 30)
    >>> m = combine_mismatch([a, b]); round(m.abs_mean * 1e6, 2), m.abs_max, m.clip_share, m.tokens
    (3.25, 9e-06, 0.375, 40)
    """
    n = sum(p.tokens for p in parts)
    if n == 0:
        return Mismatch(0.0, 0.0, 0.0, 0.0, 0)

    def mean(key: str) -> float:
        return sum(getattr(p, key) * p.tokens for p in parts) / n

    return Mismatch(mean("abs_mean"), max(p.abs_max for p in parts), mean("kl"), mean("clip_share"),
                    n)


def tis_weights(learner: torch.Tensor, behaviour: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights w_t = min(π_learner(a_t) / μ_engine(a_t), C), elementwise.

    Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"
    (blog post, August 2025): the engine samples from μ (its kernels and
    dtype), the learner's gradient is taken under π; weighting each token's policy-gradient
    term by w corrects the expectation to π's, and the cap C bounds the variance (truncated
    IS, Ionides 2008). Computed in log space: exp(min(log π − log μ, log C)), no overflow.
    The learner applies it through `decoupled_ppo` (`taurl.train.precision.tis_objective`),
    whose token-level truncate mode is this formula.
    E.g. log π = [0, −1], log μ = [−1, 0], C = 2: w = [min(e, 2), e^−1] = [2, 0.368]
    (tests/train/test_mixed_precision.py checks it by hand).
    """
    return torch.exp(torch.clamp(learner - behaviour, max=math.log(cap)))


def tis_stats(learner: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor,
              cap: float) -> dict[str, float]:
    """How much truncated IS corrects, over the action tokens (mask 1), ρ_t = π/μ:

    - ``mismatch/tis_weight_mean`` = mean_t min(ρ_t, C); ``mismatch/tis_clipped_frac`` = share
      of t with ρ_t > C;
    - ``mismatch/weight_gap_before`` = mean_t |ρ_t − 1|: how far the uncorrected gradient's
      per-token weight (1) is from the exact importance weight ρ_t;
    - ``mismatch/weight_gap_after`` = mean_t |ρ_t − min(ρ_t, C)| = mean_t max(0, ρ_t − C): the
      part TIS leaves uncorrected (0 when nothing is truncated).
    """
    m = mask.bool()
    d = (learner.detach().double() - behaviour.detach().double())[m]
    if d.numel() == 0:
        return {}
    rho = d.exp()
    w = tis_weights(d, torch.zeros_like(d), cap)
    return {"mismatch/tis_weight_mean": float(w.mean()),
            "mismatch/tis_clipped_frac": float((rho > cap).double().mean()),
            "mismatch/weight_gap_before": float((rho - 1).abs().mean()),
            "mismatch/weight_gap_after": float((rho - w).abs().mean())}
