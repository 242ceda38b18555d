"""Outcome estimators: one number per trajectory (or a return per turn), no learned critic.

Notation: for trajectory i of group g with K_g members, S_i = ``batch.scores[i]`` is its
episode return (terminal + step + process rewards, γ = 1), r_{i,t} = ``batch.turn_rewards()``
and G_{i,t} its discounted return. Trajectory-level advantages are broadcast to every real
turn. A group whose scores are all equal (or a group of one) carries no signal: its
advantage is exactly 0 and it is counted in ``learn/groups_zero_std``.
"""

from __future__ import annotations

import numpy as np

from taurl.credit.batch import Credit, TurnBatch
from taurl.credit.grouping import (
    advantage_stats,
    broadcast_rows,
    check_positive,
    group_counts,
    group_stats,
    normalize_in_groups,
    whiten,
)
from taurl.credit.returns import discounted_returns


def _credit(adv: np.ndarray, batch: TurnBatch, stats: dict[str, float],
            returns: np.ndarray | None = None) -> Credit:
    adv = np.where(batch.turn_mask, adv, 0.0)
    return Credit(advantages=adv, stats={**stats, **advantage_stats(adv, batch.turn_mask)},
                  returns=returns)


def discounted_turn_returns(batch: TurnBatch, *, gamma: float = 1.0) -> Credit:
    """A_{i,t} = G_{i,t} = Σ_{k>=t} γ^(k-t) r_{i,k}: REINFORCE with turn-level returns, no baseline.

    Source: Williams 1992 (REINFORCE); returns as in Sutton & Barto Eq. 3.8. With a final
    reward 1 at turn 4 and γ = 0.9 the turns get [0.729, 0.81, 0.9, 1].
    """
    g = discounted_returns(batch.turn_rewards(), batch.turn_mask, gamma)
    return _credit(g, batch, {}, returns=g)


def orm(batch: TurnBatch) -> Credit:
    """A_{i,t} = S_i: the outcome (reward-model) score broadcast to every turn, no baseline.

    Source: REINFORCE (Williams 1992) with an outcome-supervised reward, the ORM of
    "Let's Verify Step by Step", arXiv 2305.20050, as opposed to per-step (PRM) credit.
    """
    return _credit(broadcast_rows(batch.scores, batch.turn_mask), batch, {})


def grpo(batch: TurnBatch, *, eps: float = 1e-6) -> Credit:
    """A_i = (S_i − mean_g S) / (std_g S + eps), population std (ddof = 0).

    Source: DeepSeekMath, arXiv 2402.03300, §4.1.2 (outcome supervision). Departure: the
    std is the population std (the paper does not say; TRL/verl use ddof=1), so rewards
    [1, 0, 0, 1] give [+1, −1, −1, +1] (up to eps).
    """
    check_positive("eps", eps)
    adv, st = normalize_in_groups(batch.scores, batch.group, batch.num_groups, scale="std", eps=eps)
    return _credit(broadcast_rows(adv, batch.turn_mask), batch, group_counts(st))


def dr_grpo(batch: TurnBatch) -> Credit:
    """A_i = S_i − mean_g S: GRPO without the std division (Dr. GRPO).

    Source: "Understanding R1-Zero-Like Training", arXiv 2503.20783, §3.2: dividing
    by the group std over-weights too-easy / too-hard groups. Pair it with the
    ``seq-mean-token-sum-norm`` aggregation to remove the length bias as well.
    """
    adv, st = normalize_in_groups(batch.scores, batch.group, batch.num_groups, scale="none")
    return _credit(broadcast_rows(adv, batch.turn_mask), batch, group_counts(st))


def grpo_batch_std(batch: TurnBatch, *, eps: float = 1e-6) -> Credit:
    """A_i = (S_i − mean_g S) / (std_batch S + eps): group mean, batch std.

    Source: "Tricks or Traps? A Deep Dive into RL for LLM Reasoning", arXiv 2508.08221
    (group-level mean with batch-level std is more robust when rewards are concentrated).
    The batch std is the population std of all N scores.
    """
    check_positive("eps", eps)
    centered, st = normalize_in_groups(batch.scores, batch.group, batch.num_groups, scale="none")
    std = float(batch.scores.std()) if batch.scores.size else 0.0
    adv = centered / (std + eps) if std > 0 else np.zeros_like(centered)
    return _credit(broadcast_rows(adv, batch.turn_mask), batch,
                   {**group_counts(st), "learn/batch_score_std": std})


def rloo(batch: TurnBatch) -> Credit:
    """A_i = S_i − (1/(K−1)) Σ_{j≠i} S_j = K/(K−1) · (S_i − mean_g S): leave-one-out baseline.

    Source: Kool et al. 2019 ("Buy 4 REINFORCE samples, get a baseline for free");
    Ahmadian et al., arXiv 2402.14740 (RLOO). A group of one has no baseline: advantage 0.
    """
    centered, st = normalize_in_groups(batch.scores, batch.group, batch.num_groups, scale="none")
    k = st.count[batch.group]
    adv = np.where(k > 1, centered * k / np.maximum(k - 1, 1), 0.0)
    return _credit(broadcast_rows(adv, batch.turn_mask), batch, group_counts(st))


def reinforce_pp(batch: TurnBatch, *, gamma: float = 1.0, eps: float = 1e-6) -> Credit:
    """A_{i,t} = (G_{i,t} − μ) / (σ + eps), μ, σ over every real turn of the batch.

    Source: REINFORCE++, arXiv 2501.03262 (global advantage normalization). A KL
    penalty, if wanted, goes into the rewards first (`taurl.train.objectives.kl` gives
    per-token penalties; `taurl.credit.tokens.turn_sums` puts them on turns).
    Departure: normalization is over turns, not tokens (turn-level credit).
    """
    check_positive("eps", eps)
    g = discounted_returns(batch.turn_rewards(), batch.turn_mask, gamma)
    adv = np.zeros_like(g)
    adv[batch.turn_mask] = whiten(g[batch.turn_mask], eps)
    return _credit(adv, batch, {}, returns=g)


def reinforce_pp_baseline(batch: TurnBatch, *, gamma: float = 1.0, eps: float = 1e-6) -> Credit:
    """REINFORCE++-baseline: subtract the group-mean score, then whiten over the batch.

        r'_{i,t} = r_{i,t} − [t = last] · mean_g S,   A = whiten(G'_{i,t})

    Source: REINFORCE++, arXiv 2501.03262 (REINFORCE++-Baseline; as in OpenRLHF's
    ``reinforce_baseline``). The group mean is taken off the final reward, so with γ = 1
    every turn's return is S_i − mean_g S. Departures: whitening is over real turns (not
    tokens), and the turns of an all-equal group stay exactly 0 (left out of the whitening)
    instead of being shifted by the batch mean.
    """
    check_positive("eps", eps)
    st = group_stats(batch.scores, batch.group, batch.num_groups)
    shifted = batch.replace(rewards=batch.rewards - st.mean[batch.group])
    g = discounted_returns(shifted.turn_rewards(), batch.turn_mask, gamma)
    # an all-equal group has nothing to learn from: keep it at exactly 0 after whitening
    keep = batch.turn_mask & ~st.zero[batch.group][:, None]
    adv = np.zeros_like(g)
    adv[keep] = whiten(g[keep], eps)
    return _credit(adv, batch, group_counts(st), returns=g)
