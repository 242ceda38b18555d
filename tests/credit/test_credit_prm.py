"""The implicit-PRM shaping math and the istar estimator, on hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pytest

from taurl.credit import compute_advantages
from taurl.credit.batch import TurnBatch
from taurl.credit.prm import episode_neutral_shaping, implicit_step_rewards, istar
from taurl.errors import ConfigError, ContractError
from taurl.train.prm import step_scorer_problems

MASK = np.array([[True, True, True], [True, False, False], [True, True, False]])


def test_implicit_step_rewards_scale_the_log_ratio_and_zero_the_padding():
    q = implicit_step_rewards(
        np.array([[1.0, -2.0, 4.0], [3.0, 9.0, 9.0], [0.5, 0.5, 7.0]]), MASK, beta=0.5
    )
    np.testing.assert_allclose(q, [[0.5, -1.0, 2.0], [1.5, 0, 0], [0.25, 0.25, 0]])
    with pytest.raises(ContractError):
        implicit_step_rewards(np.array([[np.nan, 0, 0], [0, 0, 0], [0, 0, 0]]), MASK, beta=0.5)
    with pytest.raises(ConfigError):
        implicit_step_rewards(np.zeros((3, 3)), MASK, beta=0.0)


def test_shaping_is_clipped_then_centred_per_episode():
    # w = 0.1, c = 0.2: row 0 raw [0.1, -0.3→-0.2, 0.5→0.2], mean 0.0333…; row 1 one turn → 0;
    # row 2 raw [0.1, 0.3→0.2], mean 0.15
    q = np.array([[1.0, -3.0, 5.0], [4.0, 0, 0], [1.0, 3.0, 0]])
    p, stats = episode_neutral_shaping(q, MASK, weight=0.1, clip=0.2)
    m0 = (0.1 - 0.2 + 0.2) / 3
    np.testing.assert_allclose(
        p, [[0.1 - m0, -0.2 - m0, 0.2 - m0], [0, 0, 0], [-0.05, 0.05, 0]], atol=1e-12
    )
    np.testing.assert_allclose(p.sum(axis=1), 0, atol=1e-12)
    # -0.3, 0.5, 0.4 and 0.3 were clipped
    assert stats["learn/prm_clip_frac"] == pytest.approx(4 / 6)
    assert stats["learn/prm_shaping_sum_abs_max"] < 1e-12
    # the unprotected form keeps the clipped sum (what the canary catches)
    raw, _ = episode_neutral_shaping(q, MASK, weight=0.1, clip=0.2, center=False)
    np.testing.assert_allclose(raw.sum(axis=1), [0.1, 0.2, 0.3], atol=1e-12)


def test_istar_is_grpo_plus_the_group_normalized_step_term():
    # one group of two 2-turn episodes, outcomes [1, 0]; shaping p = [[+0.1, -0.1], [-0.05, +0.05]]
    p = np.array([[0.1, -0.1], [-0.05, 0.05]])
    b = TurnBatch.build([1.0, 0.0], ["g", "g"], num_turns=[2, 2], process_rewards=p)
    a = istar(b, alpha=0.5, scale="std", eps=1e-12).advantages
    # A^E = [+1, -1]; the four p have mean 0 and std sqrt((0.01+0.01+0.0025+0.0025)/4) = 0.0790569
    std = np.sqrt((0.01 + 0.01 + 0.0025 + 0.0025) / 4)
    np.testing.assert_allclose(a, [[1 + 0.5 * 0.1 / std, 1 - 0.5 * 0.1 / std],
                                   [-1 - 0.5 * 0.05 / std, -1 + 0.5 * 0.05 / std]], rtol=1e-9)
    # every episode's step term sums to 0: no advantage mass is bought by length
    np.testing.assert_allclose((a - a.mean(axis=1, keepdims=True)).sum(axis=1), 0, atol=1e-12)
    # the default keeps the shaping's own units: A = A^E + α · (p − 0)
    np.testing.assert_allclose(
        istar(b, alpha=0.5).advantages, [[1.05, 0.95], [-1.025, -0.975]], atol=1e-5
    )


def test_istar_without_a_scorer_is_exactly_grpo():
    b = TurnBatch.build([1.0, 0.0, 0.0, 1.0], ["a", "a", "b", "b"], num_turns=[2, 1, 3, 2])
    np.testing.assert_array_equal(
        compute_advantages(b, "istar").advantages, compute_advantages(b, "grpo").advantages
    )


def test_step_scorer_config_problems_are_reported_before_work():
    assert step_scorer_problems("none", {}) == []
    assert step_scorer_problems("implicit_prm", {"weight": 0.05, "clip": 0.1}) == []
    assert "step_scorer must be one of" in step_scorer_problems("prm", {})[0]
    assert "drop them" in step_scorer_problems("none", {"weight": 1.0})[0]
    assert "unknown option" in step_scorer_problems("implicit_prm", {"wieght": 1.0})[0]
    assert "clip must be < 0.5" in step_scorer_problems("implicit_prm", {"clip": 0.5})[0]
    # a scorer whose shaping an estimator cannot see is refused, not silently ignored
    assert (
        "has no effect with estimator grpo" in step_scorer_problems("implicit_prm", {}, "grpo")[0]
    )
    assert step_scorer_problems("implicit_prm", {}, "gigpo") == []
