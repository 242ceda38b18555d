"""Outcome estimators: hand-computed numbers, zero-variance groups, fast path vs loops."""

from __future__ import annotations

import warnings
from collections import defaultdict

import numpy as np
import pytest

from taurl.credit import (
    TurnBatch,
    discounted_returns,
    discounted_turn_returns,
    dr_grpo,
    grpo,
    grpo_batch_std,
    orm,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)


def test_grpo_seed_example_population_std():
    # mean = 0.5, population std = sqrt(mean((±0.5)^2)) = 0.5 -> (R - 0.5) / 0.5 = ±1
    b = TurnBatch.build([1, 0, 0, 1], [0, 0, 0, 0])
    c = grpo(b)
    np.testing.assert_allclose(c.advantages[:, 0], [1, -1, -1, 1], atol=1e-5)
    assert c.stats["learn/groups"] == 1 and c.stats["learn/groups_zero_std"] == 0


def test_returns_seed_example():
    # G_t = γ^(3-t)·1 with γ = 0.9: [0.9^3, 0.9^2, 0.9, 1] = [0.729, 0.81, 0.9, 1]
    expected = [0.729, 0.81, 0.9, 1.0]
    via_step = TurnBatch.build([0.0], [0], num_turns=[4], step_rewards=[[0, 0, 0, 1]])
    via_final = TurnBatch.build([1.0], [0], num_turns=[4])
    for b in (via_step, via_final):
        np.testing.assert_allclose(discounted_turn_returns(b, gamma=0.9).advantages[0], expected)


def test_all_equal_group_is_zero_counted_and_never_divides_by_zero():
    # group 0: three equal scores 0.1 (their float mean is not exactly 0.1); group 1:
    # [1, 0]; group 2: alone
    b = TurnBatch.build(
        [0.1, 0.1, 0.1, 1.0, 0.0, 5.0], [0, 0, 0, 1, 1, 2], num_turns=[2, 1, 3, 1, 1, 2]
    )
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        for fn in (grpo, dr_grpo, grpo_batch_std, rloo, reinforce_pp_baseline):
            c = fn(b)
            assert np.all(c.advantages[[0, 1, 2, 5]] == 0.0), fn.__name__
            assert np.all(np.isfinite(c.advantages))
            assert c.stats["learn/groups_zero_std"] == 2, fn.__name__  # group 0 and the singleton
            assert c.stats["learn/groups_singleton"] == 1
            assert c.advantages[3, 0] > 0 > c.advantages[4, 0]


def test_dr_grpo_no_std():
    # R - mean = ±0.5, no division
    c = dr_grpo(TurnBatch.build([1, 0, 0, 1], [0, 0, 0, 0]))
    np.testing.assert_allclose(c.advantages[:, 0], [0.5, -0.5, -0.5, 0.5])


def test_grpo_batch_std():
    # scores [1, 0 | 1, 1]; batch mean 0.75, batch std = sqrt((3·0.25² + 0.75²)/4) = sqrt(0.1875)
    c = grpo_batch_std(TurnBatch.build([1, 0, 1, 1], [0, 0, 1, 1]), eps=0.0 + 1e-12)
    s = np.sqrt(0.1875)
    np.testing.assert_allclose(c.advantages[:, 0], [0.5 / s, -0.5 / s, 0, 0], rtol=1e-9)


def test_rloo_leave_one_out():
    # A_1 = 1 - mean(0, 0, 1) = 2/3; A_2 = 0 - mean(1, 0, 1) = -2/3; a group of one has no baseline
    c = rloo(TurnBatch.build([1, 0, 0, 1, 7], [0, 0, 0, 0, 1]))
    np.testing.assert_allclose(c.advantages[:, 0], [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0])


def test_orm_broadcasts_the_episode_return():
    # score = terminal 1 + step rewards 0.5 = 1.5 on both real turns; padding stays 0
    b = TurnBatch.build([1.0, 0.0], [0, 0], num_turns=[2, 1], step_rewards=[[0.5, 0], [0, 0]])
    np.testing.assert_allclose(orm(b).advantages, [[1.5, 1.5], [0, 0]])


def test_reinforce_pp_whitens_over_all_turns():
    # γ = 1. Returns: traj A (2 turns, R=1): [1, 1]; traj B (1 turn, R=0): [0]; C, D (1
    # turn, R=1): [1], [1]
    # all turns [1, 1, 0, 1, 1]: mean 0.8, std 0.4 -> A: 0.5, 0.5; B: -2; C, D: 0.5
    b = TurnBatch.build([1, 0, 1, 1], [0, 0, 1, 1], num_turns=[2, 1, 1, 1])
    np.testing.assert_allclose(
        reinforce_pp(b).advantages, [[0.5, 0.5], [-2, 0], [0.5, 0], [0.5, 0]], atol=1e-5
    )
    # baseline variant: group means 0.5 and 1 are removed from the final reward, so A:
    # [0.5, 0.5], B: [-0.5];
    # group {C, D} is all-equal -> exactly 0 and not whitened. Whiten [0.5, 0.5, -0.5]: mean 1/6,
    # std = sqrt(((1/3)² + (1/3)² + (2/3)²)/3) = sqrt(2/9) -> (1/3)/sqrt(2/9) = 0.7071,
    # -(2/3)/sqrt(2/9) = -1.4142
    c = reinforce_pp_baseline(b)
    np.testing.assert_allclose(
        c.advantages, [[0.70711, 0.70711], [-1.41421, 0], [0, 0], [0, 0]], atol=1e-4
    )


# -------------------------------------------------------------------------------------------
# fast paths against plain loops on random batches


def random_batch(rng: np.random.Generator, n: int = 40, t: int = 6) -> TurnBatch:
    return TurnBatch.build(
        rewards=rng.integers(0, 3, n) / 2.0,
        group=rng.integers(0, 7, n),
        num_turns=rng.integers(0, t + 1, n),
        step_rewards=rng.normal(size=(n, t)) * (rng.random((n, t)) < 0.3),
        max_turns=t,
    )


def ref_scores(b: TurnBatch) -> list[float]:
    out = []
    for i in range(b.num_trajectories):
        s = b.rewards[i]
        for k in range(b.max_turns):
            if b.turn_mask[i, k]:
                s += b.step_rewards[i, k] + b.process_rewards[i, k]
        out.append(s)
    return out


def ref_returns(b: TurnBatch, gamma: float, final_shift: list[float] | None = None) -> np.ndarray:
    g = np.zeros(b.turn_mask.shape)
    for i in range(b.num_trajectories):
        n = int(b.turn_mask[i].sum())
        running = 0.0
        for k in reversed(range(n)):
            r = b.step_rewards[i, k] + b.process_rewards[i, k]
            if k == n - 1:
                r += b.rewards[i] - (final_shift[i] if final_shift else 0.0)
            running = r + gamma * running
            g[i, k] = running
    return g


def ref_group_relative(b: TurnBatch, kind: str, eps: float = 1e-6) -> np.ndarray:
    s = ref_scores(b)
    members = defaultdict(list)
    for i, g in enumerate(b.group):
        members[g].append(i)
    batch_std = float(np.std(s))
    adv = np.zeros(b.turn_mask.shape)
    for rows in members.values():
        vals = [s[i] for i in rows]
        mean, std, k = sum(vals) / len(vals), float(np.std(vals)), len(vals)
        for i in rows:
            if max(vals) - min(vals) < 1e-12:
                a = 0.0
            elif kind == "grpo":
                a = (s[i] - mean) / (std + eps)
            elif kind == "dr_grpo":
                a = s[i] - mean
            elif kind == "batch_std":
                a = (s[i] - mean) / (batch_std + eps)
            else:  # rloo
                a = s[i] - (sum(vals) - s[i]) / (k - 1)
            adv[i, b.turn_mask[i]] = a
    return adv


@pytest.mark.parametrize("seed", range(5))
def test_fast_paths_match_reference_loops(seed):
    rng = np.random.default_rng(seed)
    b = random_batch(rng)
    np.testing.assert_allclose(grpo(b).advantages, ref_group_relative(b, "grpo"), atol=1e-9)
    np.testing.assert_allclose(dr_grpo(b).advantages, ref_group_relative(b, "dr_grpo"), atol=1e-9)
    np.testing.assert_allclose(
        grpo_batch_std(b).advantages, ref_group_relative(b, "batch_std"), atol=1e-9
    )
    np.testing.assert_allclose(rloo(b).advantages, ref_group_relative(b, "rloo"), atol=1e-9)
    gamma = float(rng.uniform(0.5, 1.0))
    g = ref_returns(b, gamma)
    np.testing.assert_allclose(
        discounted_returns(b.turn_rewards(), b.turn_mask, gamma), g, atol=1e-12
    )
    real = g[b.turn_mask]
    np.testing.assert_allclose(reinforce_pp(b, gamma=gamma).advantages[b.turn_mask],
                               (real - real.mean()) / (real.std() + 1e-6), atol=1e-9)
    # baseline variant: group mean of the scores off the final reward, then
    # whiten non-constant groups
    s = ref_scores(b)
    means = {
        g_: np.mean([s[i] for i in range(len(s)) if b.group[i] == g_])
        for g_ in set(b.group.tolist())
    }
    const = {
        g_ for g_ in means if np.ptp([s[i] for i in range(len(s)) if b.group[i] == g_]) < 1e-12
    }
    gb = ref_returns(b, gamma, [means[g_] for g_ in b.group.tolist()])
    keep = b.turn_mask & np.array([g_ not in const for g_ in b.group.tolist()])[:, None]
    want = np.zeros_like(gb)
    want[keep] = (gb[keep] - gb[keep].mean()) / (gb[keep].std() + 1e-6)
    np.testing.assert_allclose(reinforce_pp_baseline(b, gamma=gamma).advantages, want, atol=1e-9)


def test_padding_is_always_zero_and_advantages_finite():
    b = random_batch(np.random.default_rng(9))
    for fn in (
        grpo, dr_grpo, grpo_batch_std, rloo, reinforce_pp, reinforce_pp_baseline, orm,
        discounted_turn_returns,
    ):
        adv = fn(b).advantages
        assert np.all(adv[~b.turn_mask] == 0) and np.all(np.isfinite(adv)), fn.__name__
