"""Trajectory-graph (SALT-style) estimator: hand-computed numbers and a reference loop."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from taurl.credit import TurnBatch, gigpo, salt
from taurl.credit.graph import prefix_nodes
from taurl.errors import ConfigError

S = {"s0": 0, "s1": 1, "s2": 2}
A = {"a": 10, "b": 11, "c": 12, "d": 13, "x": 14}


def batch_of(paths, rewards, group=None):
    t = max(len(p) for p in paths)
    state = np.zeros((len(paths), t), np.int64)
    action = np.zeros((len(paths), t), np.int64)
    for i, p in enumerate(paths):
        for k, (s, a) in enumerate(p):
            state[i, k], action[i, k] = S[s], A[a]
    return TurnBatch.build(rewards, group or [0] * len(paths), num_turns=[len(p) for p in paths],
                           state_hash=state, action_hash=action, max_turns=t)


# All four share the first step (s0,a); τ1, τ2 then win with (s1,b); τ3, τ4 fail with (s1,c)
PATHS = [[("s0", "a"), ("s1", "b")], [("s0", "a"), ("s1", "b")],
         [("s0", "a"), ("s1", "c")], [("s0", "a"), ("s1", "c"), ("s2", "d")]]


def test_shared_step_zero_and_failed_only_step_negative():
    # group mean 0.5, std 0.5. (s0,a): Q = mean(1,1,0,0) = 0.5 = V(root) -> 0 (shared by all).
    # (s1,b): Q = 1, parent Q = 0.5 -> +0.5/0.5 = +1. (s1,c): Q = 0 -> -1 (only in failed ones).
    # (s2,d): Q = 0, parent (s1,c) Q = 0 -> 0 (no alternative there).
    c = salt(batch_of(PATHS, [1, 1, 0, 0]))
    np.testing.assert_allclose(
        c.advantages, [[0, 1, 0], [0, 1, 0], [0, -1, 0], [0, -1, 0]], atol=1e-5
    )
    assert c.advantages[0, 0] == 0.0  # exactly
    assert c.stats["learn/graph_nodes"] == 4
    # GiGPO, for contrast: the shared first step's anchor group compares returns, so it is not 0
    g = gigpo(batch_of(PATHS, [1, 1, 0, 0]), gamma=1.0)
    np.testing.assert_allclose(g.advantages[:, 0], [2, 2, -2, -2], atol=1e-4)


def test_first_step_is_compared_with_the_group_root():
    # (s0,a) by τ1..τ3 (rewards 1, 1, 0): Q = 2/3; (s0,x) by τ4 (0): Q = 0; root V = 0.5, std 0.5
    # -> (2/3 - 1/2)/0.5 = 1/3 and (0 - 1/2)/0.5 = -1
    paths = [[("s0", "a")], [("s0", "a")], [("s0", "a")], [("s0", "x")]]
    c = salt(batch_of(paths, [1, 1, 0, 0]))
    np.testing.assert_allclose(c.advantages[:, 0], [1 / 3, 1 / 3, 1 / 3, -1], atol=1e-5)


def test_state_mode_merges_revisits():
    # τ1: (s0,a)(s1,b) win; τ2: (s0,x)(s0,a)(s1,b) win (x loops back to s0); τ3: (s0,a)(s1,c) fail.
    # scores [1, 1, 0]: mean 2/3, std sqrt(2/9) = 0.471405.
    # V(s0) = mean over 4 visits (1, 1, 1, 0) = 0.75; Q(s0,a) = mean(1, 1, 0) = 2/3; Q(s0,x) = 1
    # V(s1) = 2/3; Q(s1,b) = 1; Q(s1,c) = 0
    paths = [
        [("s0", "a"), ("s1", "b")],
        [("s0", "x"), ("s0", "a"), ("s1", "b")],
        [("s0", "a"), ("s1", "c")],
    ]
    c = salt(batch_of(paths, [1, 1, 0]), merge="state")
    s = np.sqrt(2 / 9)
    np.testing.assert_allclose(c.advantages[0, :2], [(2 / 3 - 0.75) / s, (1 / 3) / s], atol=1e-5)
    np.testing.assert_allclose(
        c.advantages[1], [0.25 / s, (2 / 3 - 0.75) / s, (1 / 3) / s], atol=1e-5
    )
    np.testing.assert_allclose(c.advantages[2, :2], [(2 / 3 - 0.75) / s, -(2 / 3) / s], atol=1e-5)


def test_all_equal_group_gives_zero():
    c = salt(batch_of(PATHS, [1, 1, 1, 1]))
    assert np.all(c.advantages == 0) and c.stats["learn/groups_zero_std"] == 1


def test_unknown_merge_mode():
    with pytest.raises(ConfigError, match="merge"):
        salt(batch_of(PATHS, [1, 1, 0, 0]), merge="tree")


def ref_salt_prefix(b: TurnBatch, eps: float = 1e-6) -> np.ndarray:
    n, t = b.turn_mask.shape
    scores = b.scores
    through = defaultdict(list)  # (group, prefix) -> scores of trajectories through it
    for i in range(n):
        path = ()
        for k in range(int(b.turn_mask[i].sum())):
            path = path + ((int(b.state_hash[i, k]), int(b.action_hash[i, k])),)
            through[(b.group[i], path)].append(scores[i])
    adv = np.zeros((n, t))
    for i in range(n):
        members = scores[b.group == b.group[i]]
        if np.ptp(members) < 1e-12:
            continue
        path, parent_v = (), members.mean()
        for k in range(int(b.turn_mask[i].sum())):
            path = path + ((int(b.state_hash[i, k]), int(b.action_hash[i, k])),)
            q = np.mean(through[(b.group[i], path)])
            adv[i, k] = (q - parent_v) / (members.std() + eps)
            parent_v = q
    return adv


def ref_salt_state(b: TurnBatch, eps: float = 1e-6) -> np.ndarray:
    n, t = b.turn_mask.shape
    scores = b.scores
    q, v = defaultdict(list), defaultdict(list)
    for i in range(n):
        for k in range(int(b.turn_mask[i].sum())):
            s, a = int(b.state_hash[i, k]), int(b.action_hash[i, k])
            q[(b.group[i], s, a)].append(scores[i])
            v[(b.group[i], s)].append(scores[i])
    adv = np.zeros((n, t))
    for i in range(n):
        members = scores[b.group == b.group[i]]
        if np.ptp(members) < 1e-12:
            continue
        for k in range(int(b.turn_mask[i].sum())):
            s, a = int(b.state_hash[i, k]), int(b.action_hash[i, k])
            adv[i, k] = (np.mean(q[(b.group[i], s, a)]) - np.mean(v[(b.group[i], s)])) / (
                members.std() + eps
            )
    return adv


@pytest.mark.parametrize("seed", range(4))
def test_salt_matches_reference_loops(seed):
    rng = np.random.default_rng(seed)
    n, t = 40, 5
    b = TurnBatch.build(
        rng.integers(0, 2, n), rng.integers(0, 4, n), num_turns=rng.integers(0, t + 1, n),
        state_hash=rng.integers(0, 2, (n, t)), action_hash=rng.integers(0, 2, (n, t)), max_turns=t,
    )
    np.testing.assert_allclose(salt(b).advantages, ref_salt_prefix(b), atol=1e-9)
    np.testing.assert_allclose(salt(b, merge="state").advantages, ref_salt_state(b), atol=1e-9)


def test_prefix_nodes_are_exact_paths():
    b = batch_of(PATHS, [1, 1, 0, 0])
    nodes, num = prefix_nodes(b)
    assert (
        num == 4
        and nodes[0, 1] == nodes[1, 1] != nodes[2, 1]
        and nodes[3, 2] >= 0
        and nodes[0, 2] == -1
    )
    # the same (state, action) after a different prefix is a different node
    b2 = batch_of([[("s0", "a"), ("s1", "b")], [("s0", "x"), ("s1", "b")]], [1, 0])
    nodes2, _ = prefix_nodes(b2)
    assert nodes2[0, 1] != nodes2[1, 1]
