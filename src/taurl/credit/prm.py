"""Implicit process rewards (iStar) as episode-neutral shaping, and the iStar advantage.

An implicit PRM is a policy-shaped model φ trained with trajectory DPO on successful vs
failed episodes of one group; the log-ratio of φ to the behaviour policy is then a
per-step reward (iStar, "Agentic RL with Implicit Step Rewards", arXiv 2509.19199, §3.2;
the implicit-PRM identity r_t = β log π_φ(a_t|s_t)/π_ref(a_t|s_t) is PRIME's, arXiv
2502.01456, Eq. 3):

    q_{i,t} = β · Σ_{k ∈ action tokens of turn t} [log π_φ(x_k | x_<k) − log π_old(x_k | x_<k)]

taurl uses q only as shaping (docs/design.md#reward, layer 3): small weight, clipped, stored in
``TurnBatch.process_rewards`` apart from the outcome, and *centred per episode*:

    c_{i,t} = clip(w · q_{i,t}, −c, c)
    p_{i,t} = c_{i,t} − (1 / n_i) Σ_{k<n_i} c_{i,k}          (n_i real turns of episode i)

so Σ_t p_{i,t} = 0 for every episode: the shaped return equals the outcome exactly. This
is what the canary (tests/credit/test_prm_canary.py) guarantees: padding an episode with
no-op or repeated steps cannot raise its total reward, and a failed episode can never end
above a successful one of the same task, whatever φ has learned. The shaping only moves
credit *between the steps of one episode* (a step better than its episode's average gets
more, a worse one less); comparing episodes stays the outcome's job. Departure from iStar:
iStar adds the raw (uncentred) step rewards' normalized advantage; the centring is ours,
chosen so that no learned scorer can be gamed by length (a raw sum Σ_t q_t grows with
every step φ likes).

Consequence: an estimator that compares episode totals only (``grpo``, ``rloo``) is, by
design, unchanged by this shaping. Estimators that credit turns read it: ``istar`` below
(GRPO + the step term), ``reinforce_pp_baseline`` / ``returns`` (reward-to-go), ``gigpo``
(its step part), ``segment_grpo``, ``gae``.
"""

from __future__ import annotations

import numpy as np

from taurl.credit.batch import Credit, TurnBatch
from taurl.credit.grouping import (
    advantage_stats,
    broadcast_rows,
    check_positive,
    group_counts,
    normalize_in_groups,
)
from taurl.errors import ConfigError, ContractError


def implicit_step_rewards(log_ratio: np.ndarray, turn_mask: np.ndarray, *,
                          beta: float) -> np.ndarray:
    """q = β · log_ratio (N, T) on real turns, 0 on padding (iStar / PRIME, module docstring).

    log_ratio: (N, T) per-turn sums of log π_φ − log π_old over each turn's action tokens
    (`taurl.credit.tokens.turn_sums`).

    >>> implicit_step_rewards(np.array([[2.0, -1.0, 9.0]]), np.array([[True, True, False]]),
    ...                       beta=0.5)
    array([[ 1. , -0.5,  0. ]])
    """
    check_positive("beta", beta)
    log_ratio = np.asarray(log_ratio, dtype=np.float64)
    if log_ratio.shape != turn_mask.shape:
        raise ContractError("prm_shape", f"log ratios must be (N, T) = {turn_mask.shape}, got "
                                         f"{log_ratio.shape}")
    if not np.all(np.isfinite(log_ratio[turn_mask])):
        raise ContractError("prm_finite", "the step scorer produced NaN or inf log-ratios")
    return np.where(turn_mask, beta * log_ratio, 0.0)


def episode_neutral_shaping(step_rewards: np.ndarray, turn_mask: np.ndarray, *, weight: float,
                            clip: float,
                            center: bool = True) -> tuple[np.ndarray, dict[str, float]]:
    """p = clip(w · q, −c, c) − its per-episode mean over real turns (module docstring).

    step_rewards, turn_mask: (N, T). Returns p (N, T), 0 on padding, with Σ_t p_{i,t} = 0
    for every row and |p| ≤ 2c; and metrics. ``center=False`` is the unprotected form (the
    clipped sum is then free to grow with the episode's length); it exists so the canary
    can show what it catches, and is not reachable from the config.

    >>> p, _ = episode_neutral_shaping(np.array([[1.0, 0.0, 5.0]]), np.array([[True, True, False]]),
    ...                                weight=0.1, clip=0.2)
    >>> p.round(3)
    array([[ 0.05, -0.05,  0.  ]])
    """
    if not weight >= 0:
        raise ConfigError(f"step scorer weight must be >= 0, got {weight!r}")
    if not clip > 0:
        raise ConfigError(f"step scorer clip must be > 0, got {clip!r}")
    raw = np.where(turn_mask, weight * np.asarray(step_rewards, dtype=np.float64), 0.0)
    clipped = np.clip(raw, -clip, clip)
    n = turn_mask.sum(axis=1)
    if center:
        mean = clipped.sum(axis=1) / np.maximum(n, 1)
        shaped = np.where(turn_mask, clipped - mean[:, None], 0.0)
    else:
        shaped = clipped
    real = bool(turn_mask.any())
    stats = {
        "learn/prm_step_reward_mean": (float(raw[turn_mask].mean() / weight) if real and weight
                                       else 0.0),
        "learn/prm_shaping_abs_per_turn": float(np.abs(shaped[turn_mask]).mean()) if real else 0.0,
        "learn/prm_shaping_sum_abs_max": (float(np.abs(shaped.sum(axis=1)).max()) if shaped.size
                                          else 0.0),
        "learn/prm_clip_frac": (float((raw[turn_mask] != clipped[turn_mask]).mean()) if real
                                else 0.0),
    }
    return shaped, stats


def istar(batch: TurnBatch, *, alpha: float = 1.0, scale: str = "none",
          eps: float = 1e-6) -> Credit:
    """A_{i,t} = A^E_i + α · A^S_{i,t}: GRPO on the episode plus iStar's step term.

        A^E_i     = (S_i − mean_g S) / (std_g S + eps)                 (GRPO on the outcome)
        A^S_{i,t} = (p_{i,t} − mean_g p) [/ (std_g p + eps)]           over every real turn of
                                                                       group g

    Source: iStar, arXiv 2509.19199, Eq. 6–8 (episode- and step-level advantages, summed).
    p = ``batch.process_rewards`` (the step scorer's shaping; without one A^S = 0 and this
    is exactly ``grpo``). With the episode-neutral shaping above, mean_g p = 0 and every
    episode's A^S sums to 0 over its turns, so padding buys no advantage mass either.

    Departure: scale="none" (the default) keeps A^S in the shaping's own units, so the
    scorer's small weight and clip bound it; the paper's scale="std" divides by the group's
    step-reward std, which turns even a near-zero, untrained scorer's noise into unit-scale
    advantages (measured: docs/experiments/estimators.md, "Learned step scorer").
    """
    if not alpha >= 0:
        raise ConfigError(f"istar alpha (step-advantage weight) must be >= 0, got {alpha!r}")
    if scale not in ("std", "none"):
        raise ConfigError(f"istar scale must be 'std' or 'none', got {scale!r}")
    check_positive("eps", eps)
    ep, st = normalize_in_groups(batch.scores, batch.group, batch.num_groups, scale="std", eps=eps)
    mask = batch.turn_mask
    a_s = np.zeros(mask.shape)
    turn_group = np.broadcast_to(batch.group[:, None], mask.shape)[mask]
    a_s[mask], _ = normalize_in_groups(
        batch.process_rewards[mask], turn_group, batch.num_groups, scale=scale, eps=eps
    )
    adv = np.where(mask, broadcast_rows(ep, mask) + alpha * a_s, 0.0)
    stats = {
        **group_counts(st),
        "learn/adv_step_abs_mean": float(np.abs(a_s[mask]).mean()) if mask.any() else 0.0,
    }
    return Credit(advantages=adv, stats={**stats, **advantage_stats(adv, mask)})
