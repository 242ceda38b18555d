"""Discounted returns and generalized advantage estimation over padded step arrays.

Both are pure numpy functions on (N, T) arrays whose valid steps form a prefix of each row
(``mask``); the step axis may be turns or tokens. The fast paths loop over T only and are
vectorized over N; `tests/credit` checks them against plain per-element loops.
"""

from __future__ import annotations

import numpy as np

from taurl.credit.grouping import check_unit


def discounted_returns(rewards: np.ndarray, mask: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = Σ_{k>=t} γ^(k-t) r_k over each row's valid steps (Sutton & Barto, Eq. 3.8).

    rewards, mask: (N, T); returns (N, T) float64, 0 where mask is False. The return never
    crosses into padding: the step after the last valid one contributes 0.

    >>> discounted_returns(np.array([[0., 0., 0., 1.]]), np.ones((1, 4), bool), 0.9).round(3)
    array([[0.729, 0.81 , 0.9  , 1.   ]])
    """
    check_unit("gamma", gamma)
    n, t = rewards.shape
    out = np.zeros((n, t), dtype=np.float64)
    running = np.zeros(n, dtype=np.float64)
    for k in range(t - 1, -1, -1):
        running = np.where(mask[:, k], rewards[:, k] + gamma * running, 0.0)
        out[:, k] = running
    return out


def gae(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, *, gamma: float = 1.0,
        lam: float = 0.95, last_values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation (Schulman et al. 2015, arXiv 1506.02438, Eq. 16).

        δ_t = r_t + γ V(s_{t+1}) − V(s_t)        (V(s_{n}) = last_values, default 0)
        A_t = δ_t + γλ A_{t+1}                    returns_t = A_t + V(s_t)

    rewards, values, mask: (N, T), valid steps a prefix of each row. last_values: (N,)
    value of the state after the last valid step — 0 for an episode that terminated; pass
    V(s_n) to bootstrap an episode that was truncated. Returns (advantages, returns), both
    (N, T) float64 and 0 where mask is False.
    """
    check_unit("gamma", gamma)
    check_unit("lam", lam)
    n, t = rewards.shape
    adv = np.zeros((n, t), dtype=np.float64)
    next_value = np.zeros(n) if last_values is None else np.asarray(last_values, dtype=np.float64)
    running = np.zeros(n, dtype=np.float64)
    for k in range(t - 1, -1, -1):
        valid = mask[:, k]
        # the step after a row's last valid step is the bootstrap value, not padding
        is_last = valid & ~(mask[:, k + 1] if k + 1 < t else np.zeros(n, bool))
        v_next = np.where(is_last, next_value, values[:, k + 1] if k + 1 < t else 0.0)
        a_next = np.where(is_last, 0.0, running)
        delta = rewards[:, k] + gamma * v_next - values[:, k]
        running = np.where(valid, delta + gamma * lam * a_next, 0.0)
        adv[:, k] = running
    returns = np.where(mask, adv + values, 0.0)
    return adv, returns
