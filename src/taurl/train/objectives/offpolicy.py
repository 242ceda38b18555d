"""Decoupled (off-policy) PPO: behaviour policy ≠ proximal policy.

With asynchronous rollouts the tokens were sampled by a *behaviour* policy μ (an older
version, or the inference engine's numerics), while the trust region should be centred
on a recent *proximal* policy π_prox (recomputed by the learner). The objective separates
the two (Hilton et al., arXiv 2110.00641; AReaL, arXiv 2505.24298):

    w      = π_prox / μ                                 (importance weight, no gradient)
    ρ_t    = π_θ / π_prox
    ℓ_t    = w · max(−A ρ_t, −A clip(ρ_t, 1 − ε_low, 1 + ε_high))

w is taken at one of three levels and then bounded (``is_mode``):

* level "token": w_t = π_prox(a_t) / μ(a_t);
* level "sequence": w_i = Π_t w_t over the sequence's action tokens (exact, high variance);
* level "geometric": w_i = (Π_t w_t)^(1/|y_i|) (length-normalized, as GSPO's ratio);
* mode "truncate": w ← min(w, cap) (truncated importance sampling, TIS; Ionides 2008,
  used for the rollout/training mismatch by Yao et al. 2025);
* mode "mask": tokens (or whole sequences) with w outside [floor, cap] get weight 0 —
  masked importance sampling; the rest keep w. Masked tokens stay in the aggregation's
  denominator, so the loss scale does not jump with the number masked.

When μ = π_prox, w = 1 and this is `ppo_clip_loss`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from taurl.credit.registry import did_you_mean
from taurl.errors import ConfigError
from taurl.train.objectives.aggregation import (
    aggregate,
    check_aggregation,
    masked,
    masked_mean,
    sequence_sums,
)
from taurl.train.objectives.ppo import Metrics, check_clip, clipped_surrogate, surrogate_metrics

IS_LEVELS = ("token", "sequence", "geometric")
IS_MODES = ("truncate", "mask")


def is_options_problems(is_level: object = "token", is_mode: object = "truncate",
                        is_cap: object = 2.0, is_floor: object = 0.0, **_: object) -> list[str]:
    """Every problem with the importance-weight options (config input: types checked, nothing
    coerced).

    >>> is_options_problems(is_level="geometrc", is_cap=0.5, is_floor=1.0)[0]
    "objective_options.is_level: unknown 'geometrc'. Did you mean 'geometric'? One of: token,
    sequence, geometric"
    """
    problems = []
    if not isinstance(is_level, str) or is_level not in IS_LEVELS:
        hint = did_you_mean(is_level, list(IS_LEVELS)) if isinstance(is_level, str) else ""
        problems.append(f"objective_options.is_level: unknown {is_level!r}.{hint} One of: "
                        f"{', '.join(IS_LEVELS)}")
    if not isinstance(is_mode, str) or is_mode not in IS_MODES:
        hint = did_you_mean(is_mode, list(IS_MODES)) if isinstance(is_mode, str) else ""
        problems.append(f"objective_options.is_mode: unknown {is_mode!r}.{hint} One of: "
                        f"{', '.join(IS_MODES)}")
    numbers = {}
    for name, v in (("is_cap", is_cap), ("is_floor", is_floor)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            problems.append(f"objective_options.{name} must be a finite number, got {v!r}")
        else:
            numbers[name] = float(v)
    cap, floor = numbers.get("is_cap"), numbers.get("is_floor")
    if cap is not None and not cap > 0:
        problems.append("objective_options.is_cap must be > 0 (the largest importance weight "
                        f"kept), got {is_cap!r}")
    if floor is not None and floor < 0:
        problems.append(f"objective_options.is_floor must be >= 0, got {is_floor!r}")
    if cap is not None and floor is not None and cap > 0 and not floor < cap:
        problems.append(f"objective_options.is_floor ({is_floor!r}) must be below is_cap "
                        f"({is_cap!r})")
    if floor and is_mode == "truncate":
        problems.append("objective_options.is_floor only applies with is_mode: mask (truncation "
                        "bounds the weight from above only); set is_mode: mask or drop is_floor")
    return problems


def _check(level: str, mode: str, cap: float, floor: float) -> None:
    if problems := is_options_problems(is_level=level, is_mode=mode, is_cap=cap, is_floor=floor):
        raise ConfigError(problems)


def importance_weights(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, *,
                       level: str = "token", mode: str = "truncate", cap: float = 2.0,
                       floor: float = 0.0,
                       traj_index: Tensor | None = None) -> tuple[Tensor, Metrics]:
    """Bounded importance weights w (B, L) = π_prox / μ at `level`, without gradient; 0 off the
    mask.

    Computed in log space, so a sequence-level product never overflows before the bound.
    """
    _check(level, mode, cap, floor)
    with torch.no_grad():
        token_log_w = masked(proximal_logprobs - behaviour_logprobs, mask).float()
        log_w = token_log_w
        if level != "token":
            seq_sum, seq_count, row_seq = sequence_sums(log_w, mask, traj_index)
            per_seq = seq_sum if level == "sequence" else seq_sum / seq_count.clamp(min=1)
            log_w = per_seq[row_seq][:, None].expand_as(log_w)
        log_cap = math.log(cap)
        if mode == "truncate":
            w = torch.exp(torch.clamp(log_w, max=log_cap))
            bounded = log_w > log_cap
        else:
            log_floor = math.log(floor) if floor > 0 else -math.inf
            bounded = (log_w > log_cap) | (log_w < log_floor)
            w = torch.where(bounded, torch.zeros_like(log_w),
                            torch.exp(torch.clamp(log_w, max=log_cap)))
        m = mask.bool()
        w = masked(w, m)
        raw = torch.exp(torch.clamp(log_w, max=80.0))
        metrics = {
            "learn/is_weight_mean": float(masked_mean(w, m)),
            "learn/is_weight_max_raw": float(masked(raw, m).max()) if m.any() else 1.0,
            "learn/is_bounded_frac": float(masked_mean(bounded.float(), m)),  # truncated or masked
            # k3 estimate of KL(μ ‖ π_prox) from the sampled tokens: how stale the data is
            "learn/behaviour_kl": float(masked_mean(torch.expm1(token_log_w) - token_log_w, m)),
        }
    return w.to(proximal_logprobs.dtype), metrics


def decoupled_ppo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                       behaviour_logprobs: Tensor, eps_low: float = 0.2, eps_high: float = 0.2,
                       dual_clip: float | None = None, is_level: str = "token",
                       is_mode: str = "truncate",
                       is_cap: float = 2.0, is_floor: float = 0.0, aggregation: str = "token-mean",
                       traj_index: Tensor | None = None, norm_constant: float | None = None,
                       denominator: float | None = None) -> tuple[Tensor, Metrics]:
    """Decoupled PPO (module docstring).

    logprobs: (B, L) log π_θ with grad; old_logprobs: (B, L) log π_prox, the proximal
    policy the learner recomputed; behaviour_logprobs: (B, L) log μ recorded at sampling
    (``Trajectory.logprobs``). Returns (loss, metrics).
    """
    check_clip(eps_low, eps_high, dual_clip)
    check_aggregation(aggregation)
    w, is_metrics = importance_weights(old_logprobs.detach(), behaviour_logprobs.detach(), mask,
                                       level=is_level, mode=is_mode, cap=is_cap, floor=is_floor,
                                       traj_index=traj_index)
    log_ratio = masked(logprobs - old_logprobs.detach(), mask)
    ratio = torch.exp(log_ratio)
    adv = masked(advantages.detach().to(logprobs.dtype), mask)
    surrogate, flags = clipped_surrogate(ratio, adv, eps_low, eps_high, dual_clip)
    loss_tok = w * surrogate
    loss = aggregate(loss_tok, mask, aggregation, traj_index=traj_index,
                     norm_constant=norm_constant, denominator=denominator)
    return loss, {"learn/pg_loss": float(loss.detach()),
                  **surrogate_metrics(loss_tok, ratio, log_ratio, flags, mask), **is_metrics}
