"""GiGPO: anchor-state groups, hand-computed advantages, similarity mode, fast path vs loop."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from taurl.credit import TurnBatch, gigpo, gigpo_components
from taurl.credit.gigpo import anchor_groups, similar_state_ids
from taurl.errors import ConfigError

# states and actions by name; hashes are just their indexes
S = {"s0": 0, "s1": 1, "s2": 2, "s3": 3}
A = {"a": 10, "b": 11, "c": 12, "d": 13, "e": 14, "f": 15}


def batch_of(paths: list[list[tuple[str, str]]], rewards: list[float]) -> TurnBatch:
    t = max(len(p) for p in paths)
    state = np.zeros((len(paths), t), np.int64)
    action = np.zeros((len(paths), t), np.int64)
    for i, p in enumerate(paths):
        for k, (s, a) in enumerate(p):
            state[i, k], action[i, k] = S[s], A[a]
    return TurnBatch.build(rewards, [0] * len(paths), num_turns=[len(p) for p in paths],
                           state_hash=state, action_hash=action, max_turns=t)


def test_step_only_in_failed_trajectories_is_negative():
    # τ1, τ2 win via (s0,a)(s1,b); τ3 fails via (s0,a)(s1,c)(s2,d); τ4 fails via
    # (s0,e)(s3,f). γ = 1.
    # A^E = [1, 1, -1, -1]. Anchor s1 = {τ1, τ2, τ3} with returns {1, 1, 0}: mean 2/3, std sqrt(2/9)
    # -> A^S(τ3 at s1) = -(2/3)/sqrt(2/9) = -1.41421; A^S(τ1 at s1) = (1/3)/sqrt(2/9) = 0.70711.
    # Anchor s0 = all four, returns [1, 1, 0, 0] -> A^S = ±1. s2, s3 are singletons -> 0.
    b = batch_of(
        [
            [("s0", "a"), ("s1", "b")], [("s0", "a"), ("s1", "b")],
            [("s0", "a"), ("s1", "c"), ("s2", "d")], [("s0", "e"), ("s3", "f")],
        ],
        [1, 1, 0, 0],
    )
    a_e, a_s, stats = gigpo_components(b, gamma=1.0)
    np.testing.assert_allclose(a_e[:, 0], [1, 1, -1, -1], atol=1e-5)
    np.testing.assert_allclose(a_s[0, :2], [1, 0.70711], atol=1e-4)
    np.testing.assert_allclose(a_s[2], [-1, -1.41421, 0], atol=1e-4)
    np.testing.assert_allclose(a_s[3], [-1, 0, 0], atol=1e-4)
    assert stats["learn/step_groups"] == 4 and stats["learn/step_groups_singleton"] == 2
    total = gigpo(b, gamma=1.0, omega=1.0).advantages
    # the failed-only steps: (s1, c) of τ3 and (s0, e) of τ4
    assert total[2, 1] == pytest.approx(-1 - 1.41421, abs=1e-4)
    assert total[3, 0] == pytest.approx(-2, abs=1e-4)


def test_step_shared_by_all_trajectories_is_zero():
    # Everyone wins; τ2 makes a detour (s0,c)->(s2,d) before the shared last step (s1,b). γ = 0.9.
    # A^E = 0 (all equal, counted). Anchor s1: returns all 1 -> A^S = 0 (zero-std step group).
    # Anchor s0: returns [0.9, 0.81, 0.9]: mean 0.87, std sqrt((2·0.03² + 0.06²)/3) = sqrt(0.0018)
    # -> detour A^S = -0.06/0.042426 = -1.41421, direct route +0.70711.
    b = batch_of([[("s0", "a"), ("s1", "b")], [("s0", "c"), ("s2", "d"), ("s1", "b")],
                  [("s0", "a"), ("s1", "b")]], [1, 1, 1])
    c = gigpo(b, gamma=0.9)
    assert c.advantages[0, 1] == 0.0 and c.advantages[1, 2] == 0.0 and c.advantages[2, 1] == 0.0
    np.testing.assert_allclose(c.advantages[:, 0], [0.70711, -1.41421, 0.70711], atol=1e-4)
    assert c.stats["learn/groups_zero_std"] == 1
    assert c.stats["learn/step_groups_zero_std"] == 2  # s1 (all equal) and s2 (alone)


def test_anchor_groups_never_cross_episode_groups():
    state = np.array([[5, 6], [5, 6], [5, 7]])
    mask = np.array([[True, True], [True, True], [True, False]])
    ids, k = anchor_groups(np.array([0, 0, 1]), state, mask)
    assert k == 3  # (g0, 5), (g0, 6), (g1, 5)
    assert ids[0, 0] == ids[1, 0] != ids[2, 0] and ids[2, 1] == -1


def test_similarity_mode_merges_near_identical_observations():
    # "results: paris, france" vs "results: paris, frances": difflib ratio 2·22/45 = 0.978 >= 0.9
    texts = (
        ("task", "results: paris, france"),
        ("task", "results: paris, frances"),
        ("task", "error: bad query"),
    )
    b = TurnBatch.build([1, 0, 0], [0, 0, 0], num_turns=[2, 2, 2]).replace(state_text=texts)
    ids = similar_state_ids(b.state_text, b.group, b.turn_mask, threshold=0.9)
    assert ids[0, 0] == ids[1, 0] == ids[2, 0]  # identical prompt
    assert ids[0, 1] == ids[1, 1] != ids[2, 1]
    c = gigpo(b, anchor="similarity", similarity_threshold=0.9, gamma=1.0)
    exact = gigpo(b, anchor="exact", gamma=1.0)  # build() gives every turn its own state
    assert c.stats["learn/step_groups"] == 3 and exact.stats["learn/step_groups"] == 6
    # threshold 1.0 is exact matching
    ids1 = similar_state_ids(b.state_text, b.group, b.turn_mask, threshold=1.0)
    assert ids1[0, 1] != ids1[1, 1]


def test_similarity_mode_needs_texts():
    with pytest.raises(ConfigError, match="state texts"):
        gigpo(TurnBatch.build([1, 0], [0, 0]), anchor="similarity")
    with pytest.raises(ConfigError, match="anchor"):
        gigpo(TurnBatch.build([1, 0], [0, 0]), anchor="fuzzy")


def ref_gigpo(b: TurnBatch, gamma: float, omega: float, eps: float = 1e-6) -> np.ndarray:
    n, t = b.turn_mask.shape
    scores = b.scores
    g_rows = defaultdict(list)
    for i in range(n):
        g_rows[b.group[i]].append(i)
    a_e = np.zeros(n)
    for rows in g_rows.values():
        v = scores[rows]
        if np.ptp(v) > 1e-12:
            a_e[rows] = (v - v.mean()) / (v.std() + eps)
    rew = b.turn_rewards()
    ret = np.zeros((n, t))
    for i in range(n):
        run = 0.0
        for k in reversed(range(int(b.turn_mask[i].sum()))):
            run = rew[i, k] + gamma * run
            ret[i, k] = run
    anchors = defaultdict(list)
    for i in range(n):
        for k in range(int(b.turn_mask[i].sum())):
            anchors[(b.group[i], b.state_hash[i, k])].append((i, k))
    a_s = np.zeros((n, t))
    for cells in anchors.values():
        v = np.array([ret[c] for c in cells])
        if np.ptp(v) > 1e-12:
            for c, x in zip(cells, (v - v.mean()) / (v.std() + eps), strict=True):
                a_s[c] = x
    return np.where(b.turn_mask, a_e[:, None] + omega * a_s, 0.0)


@pytest.mark.parametrize("seed", range(4))
def test_gigpo_matches_reference_loop(seed):
    rng = np.random.default_rng(seed)
    n, t = 48, 6
    b = TurnBatch.build(
        rng.integers(0, 2, n), rng.integers(0, 6, n), num_turns=rng.integers(0, t + 1, n),
        step_rewards=rng.normal(size=(n, t)) * (rng.random((n, t)) < 0.2),
        state_hash=rng.integers(0, 3, (n, t)), max_turns=t,
    )
    gamma, omega = float(rng.uniform(0.5, 1)), float(rng.uniform(0, 2))
    np.testing.assert_allclose(
        gigpo(b, gamma=gamma, omega=omega).advantages, ref_gigpo(b, gamma, omega), atol=1e-9
    )
