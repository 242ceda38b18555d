"""GAE at the turn level, with a learned value function (critic or value head).

The critic itself lives with the learner (`taurl.train.objectives.value`: `ValueModel`,
`value_loss`); this estimator only reads the values it produced for each turn's state.
"""

from __future__ import annotations

import numpy as np

from taurl.credit.batch import Credit, TurnBatch
from taurl.credit.grouping import advantage_stats, whiten
from taurl.credit.returns import gae
from taurl.errors import ConfigError


def gae_turns(batch: TurnBatch, *, gamma: float = 1.0, lam: float = 0.95, normalize: bool = False,
              eps: float = 1e-6) -> Credit:
    """PPO-style GAE over turns: δ_t = r_t + γ V(s_{t+1}) − V(s_t), A_t = Σ_k (γλ)^k δ_{t+k}.

    Source: arXiv 1506.02438, Eq. 16 (see `taurl.credit.returns.gae`). r_t are
    ``batch.turn_rewards()``; V(s_t) = ``batch.values`` (the critic's value of the state the
    action was taken in, e.g. its output at the last token before the action segment).
    ``returns`` (A + V) are the value targets. normalize=True whitens A over real turns
    (PPO's advantage normalization).

    Departure: a truncated episode is not bootstrapped (V after its last turn is 0), since
    the batch holds no value for the state after the cut; pass last values to
    `taurl.credit.returns.gae` directly to bootstrap.
    """
    if batch.values is None:
        raise ConfigError("estimator 'gae' needs value estimates: build the batch with values=... "
                          "(batch.replace(values=critic_values)), or pick a critic-free estimator such as 'grpo'")
    adv, ret = gae(batch.turn_rewards(), batch.values, batch.turn_mask, gamma=gamma, lam=lam)
    if normalize:
        adv[batch.turn_mask] = whiten(adv[batch.turn_mask], eps)
    adv = np.where(batch.turn_mask, adv, 0.0)
    stats = advantage_stats(adv, batch.turn_mask)
    if batch.turn_mask.any():
        v = batch.values[batch.turn_mask]
        r = ret[batch.turn_mask]
        var = float(r.var())
        stats["learn/value_explained_var"] = float(1.0 - (r - v).var() / var) if var > 0 else 0.0
    return Credit(advantages=adv, stats=stats, returns=ret)
