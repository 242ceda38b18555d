"""GAE: hand-computed numbers, bootstrapping, the estimator wrapper, fast path vs a loop."""

from __future__ import annotations

import numpy as np
import pytest

from taurl.credit import TurnBatch, gae, gae_turns
from taurl.errors import ConfigError

R = np.array([[0.0, 0.0, 1.0]])
V = np.array([[0.5, 0.6, 0.7]])
M = np.ones((1, 3), bool)


def test_gae_lambda_one_is_return_minus_value():
    # γ = λ = 1: A_t = G_t − V_t = 1 − V_t; returns = G_t = 1
    adv, ret = gae(R, V, M, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv, [[0.5, 0.4, 0.3]])
    np.testing.assert_allclose(ret, [[1, 1, 1]])


def test_gae_lambda_zero_is_td_error():
    # δ_0 = 0 + 0.6 − 0.5, δ_1 = 0 + 0.7 − 0.6, δ_2 = 1 + 0 − 0.7
    adv, _ = gae(R, V, M, gamma=1.0, lam=0.0)
    np.testing.assert_allclose(adv, [[0.1, 0.1, 0.3]])


def test_gae_hand_computed_general_case():
    # γ = 0.9, λ = 0.5: δ = [0.9·0.6 − 0.5, 0.9·0.7 − 0.6, 1 − 0.7] = [0.04, 0.03, 0.3]
    # A_2 = 0.3; A_1 = 0.03 + 0.45·0.3 = 0.165; A_0 = 0.04 + 0.45·0.165 = 0.11425
    adv, ret = gae(R, V, M, gamma=0.9, lam=0.5)
    np.testing.assert_allclose(adv, [[0.11425, 0.165, 0.3]])
    np.testing.assert_allclose(ret, adv + V)


def test_gae_bootstraps_a_truncated_episode():
    # V(s_3) = 2 after the cut: δ_2 = 1 + 0.9·2 − 0.7 = 2.1
    adv, _ = gae(R, V, M, gamma=0.9, lam=0.0, last_values=np.array([2.0]))
    np.testing.assert_allclose(adv[0, 2], 2.1)


def ref_gae(rewards, values, mask, gamma, lam):
    adv = np.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        n = int(mask[i].sum())
        running = 0.0
        for t in reversed(range(n)):
            v_next = values[i, t + 1] if t + 1 < n else 0.0
            delta = rewards[i, t] + gamma * v_next - values[i, t]
            running = delta + gamma * lam * running
            adv[i, t] = running
    return adv


@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_reference_loop(seed):
    rng = np.random.default_rng(seed)
    n, t = 30, 7
    mask = np.arange(t)[None, :] < rng.integers(0, t + 1, n)[:, None]
    rewards = rng.normal(size=(n, t)) * mask
    values = rng.normal(size=(n, t)) * mask
    gamma, lam = rng.uniform(0.5, 1), rng.uniform(0, 1)
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    np.testing.assert_allclose(adv, ref_gae(rewards, values, mask, gamma, lam), atol=1e-12)
    np.testing.assert_allclose(ret, np.where(mask, adv + values, 0), atol=1e-12)


def test_gae_estimator_reads_batch_values_and_rewards():
    b = TurnBatch.build([1.0, 0.0], [0, 0], num_turns=[3, 1], values=[[0.5, 0.6, 0.7], [0.2, 0, 0]])
    c = gae_turns(b, gamma=0.9, lam=0.5)
    np.testing.assert_allclose(c.advantages[0], [0.11425, 0.165, 0.3])
    np.testing.assert_allclose(c.advantages[1], [-0.2, 0, 0])  # δ = 0 − 0.2, padding 0
    np.testing.assert_allclose(c.returns[0], [0.61425, 0.765, 1.0])
    assert "learn/value_explained_var" in c.stats


def test_gae_estimator_without_values_says_how_to_fix():
    with pytest.raises(ConfigError, match="values="):
        gae_turns(TurnBatch.build([1.0], [0]))


def test_gae_rejects_bad_hyperparameters():
    with pytest.raises(ConfigError, match="lam"):
        gae(R, V, M, lam=1.5)


def test_gae_bootstraps_a_truncated_episode_from_v_of_its_last_state_and_not_a_terminated_one():
    """Two rows, both r = [0, 0], V = [0.5, 0.6], V(s_T) = 0.8, γ = λ = 1.

    truncated:  δ_1 = 0 + 0.8 − 0.6 = 0.2, δ_0 = 0 + 0.6 − 0.5 = 0.1
                → A = [0.3, 0.2], R = [0.8, 0.8]
    terminated: δ_1 = 0 + 0   − 0.6 = −0.6
                → A = [−0.5, −0.6], R = [0, 0]
    """
    b = TurnBatch.build([0.0, 0.0], [0, 0], num_turns=[2, 2], values=[[0.5, 0.6], [0.5, 0.6]],
                        bootstrap_values=[0.8, 0.8], truncated=[True, False])
    c = gae_turns(b, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(c.advantages, [[0.3, 0.2], [-0.5, -0.6]])
    np.testing.assert_allclose(c.returns, [[0.8, 0.8], [0.0, 0.0]])
    assert c.stats["learn/bootstrapped_rows"] == 1.0
    # rows selected from the batch keep their bootstrap values
    np.testing.assert_allclose(b.select([1, 0]).bootstrap_values, [0.8, 0.8])
