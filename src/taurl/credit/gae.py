"""GAE at the turn level, with a learned value function (one value per turn).

The critic lives with the learner (`taurl.train.critic.Critic`: a `ValueModel` trained
with the clipped `value_loss`); this estimator only reads the values it produced for each
turn's state (``batch.values``) and for the state after the last turn
(``batch.bootstrap_values``).
"""

from __future__ import annotations

import numpy as np

from taurl.credit.batch import Credit, TurnBatch
from taurl.credit.grouping import advantage_stats, whiten
from taurl.credit.returns import gae
from taurl.errors import ConfigError


def bootstrap_last_values(batch: TurnBatch) -> np.ndarray:
    """(N,) V after each row's last turn: V(s_T) for a truncated row, 0 for a terminated one.

    A terminated episode reached a terminal state, whose value is 0 by definition; a
    truncated one was cut off from outside (a budget ran out), so the return it would have
    collected is estimated by V(s_T) (Pardo et al. 2018, "Time Limits in Reinforcement
    Learning", arXiv 1712.00378 §3). Without ``bootstrap_values`` every row gets 0.
    """
    if batch.bootstrap_values is None:
        return np.zeros(batch.num_trajectories)
    return np.where(batch.truncated, batch.bootstrap_values, 0.0)


def gae_turns(batch: TurnBatch, *, gamma: float = 1.0, lam: float = 0.95, normalize: bool = False,
              eps: float = 1e-6) -> Credit:
    """PPO-style GAE over turns: δ_t = r_t + γ V(s_{t+1}) − V(s_t), A_t = Σ_k (γλ)^k δ_{t+k}.

    Source: arXiv 1506.02438, Eq. 16 (see `taurl.credit.returns.gae`); one step is one turn
    (one action segment), as in turn-level PPO for agents. r_t are ``batch.turn_rewards()``;
    V(s_t) = ``batch.values`` (the critic's value of the state the action was taken in, its
    output at the last token before the action segment); V(s_n) after the last turn is
    `bootstrap_last_values` (V(s_T) if truncated, 0 if terminated). ``returns`` (A + V) are
    the value targets. normalize=True whitens A over real turns (PPO's advantage
    normalization).

    Departure: none in the formula; a batch without ``bootstrap_values`` treats truncated
    rows as terminated (V after the cut = 0).
    """
    if batch.values is None:
        raise ConfigError("estimator 'gae' needs value estimates: build the batch with values=... "
                          "(batch.replace(values=critic_values)), or pick a critic-free estimator "
                          "such as 'grpo'")
    adv, ret = gae(batch.turn_rewards(), batch.values, batch.turn_mask, gamma=gamma, lam=lam,
                   last_values=bootstrap_last_values(batch))
    if normalize:
        adv[batch.turn_mask] = whiten(adv[batch.turn_mask], eps)
    adv = np.where(batch.turn_mask, adv, 0.0)
    stats = advantage_stats(adv, batch.turn_mask)
    if batch.turn_mask.any():
        v = batch.values[batch.turn_mask]
        r = ret[batch.turn_mask]
        var = float(r.var())
        stats["learn/value_explained_var"] = float(1.0 - (r - v).var() / var) if var > 0 else 0.0
        stats["learn/value_mean"] = float(v.mean())
        stats["learn/bootstrapped_rows"] = float((batch.truncated & (batch.num_turns > 0)).sum()
                                                 if batch.bootstrap_values is not None else 0.0)
    return Credit(advantages=adv, stats=stats, returns=ret)
