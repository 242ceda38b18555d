"""Segment-level credit: returns stay inside sub-goal segments; fast path vs a loop."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from taurl.credit import TurnBatch, grpo, segment_grpo
from taurl.errors import ConfigError

# two trajectories of one group, 3 turns, a sub-goal boundary after turn 1 (segments [0, 0, 1]).
# τ1 reaches the sub-goal (step reward 1 at turn 1) but fails the task (terminal 0);
# τ2 misses the sub-goal but succeeds (terminal 1). Episode returns are equal (1 and 1).
B = TurnBatch.build([0.0, 1.0], [0, 0], num_turns=[3, 3], step_rewards=[[0, 1, 0], [0, 0, 0]],
                    segment_id=[[0, 0, 1], [0, 0, 1]])


def test_outcome_last_credits_each_segment_separately():
    # segment scores (γ = 1): τ1 [1, 0], τ2 [0, 1]; per segment position: [1, 0] -> ±1, [0, 1] -> ∓1
    c = segment_grpo(B, outcome="last")
    np.testing.assert_allclose(c.advantages, [[1, 1, -1], [-1, -1, 1]], atol=1e-5)
    assert c.stats["learn/segments"] == 4
    # GRPO on whole episodes sees two equal returns and learns nothing
    assert np.all(grpo(B).advantages == 0)


def test_outcome_all_adds_the_terminal_reward_to_every_segment():
    # τ1 [1 + 0, 0 + 0] = [1, 0]; τ2 [0 + 1, 0 + 1] = [1, 1] -> position 0 all equal: 0 (counted);
    # position 1: [0, 1] -> [-1, +1]
    c = segment_grpo(B, outcome="all")
    np.testing.assert_allclose(c.advantages, [[0, 0, -1], [0, 0, 1]], atol=1e-5)
    assert c.stats["learn/segment_groups_zero_std"] == 1


def test_discount_restarts_at_each_segment():
    # one segment of turns 1..2 with reward 1 at turn 2, γ = 0.5: score 0.5·1
    # (discounted from turn 1);
    # the other trajectory's segment gets 1 at its own first turn: score 1. -> [-1, +1] in that slot
    b = TurnBatch.build([0, 0], [0, 0], num_turns=[3, 2], step_rewards=[[0, 0, 1], [0, 1, 0]],
                        segment_id=[[0, 1, 1], [0, 1, 1]])
    c = segment_grpo(b, gamma=0.5, outcome="last")
    np.testing.assert_allclose(c.advantages, [[0, -1, -1], [0, 1, 0]], atol=1e-5)


def test_bad_outcome_option():
    with pytest.raises(ConfigError, match="outcome"):
        segment_grpo(B, outcome="first")


def ref_segments(b: TurnBatch, gamma: float, outcome: str, eps: float = 1e-6) -> np.ndarray:
    n, t = b.turn_mask.shape
    segs = {}  # (row, seg) -> (score, turns)
    for i in range(n):
        nt = int(b.turn_mask[i].sum())
        for k in range(nt):
            key = (i, int(b.segment_id[i, k]))
            score, turns = segs.get(key, (0.0, []))
            r = b.step_rewards[i, k] + b.process_rewards[i, k]
            if outcome == "last" and k == nt - 1:
                r += b.rewards[i]
            score += gamma ** len(turns) * r
            segs[key] = (score, turns + [k])
    slots = defaultdict(list)
    for (i, s), (score, _) in segs.items():
        slots[(b.group[i], s)].append((i, s, score + (b.rewards[i] if outcome == "all" else 0.0)))
    adv = np.zeros((n, t))
    for members in slots.values():
        v = np.array([m[2] for m in members])
        for (i, s, _), x in zip(members, v, strict=True):
            a = 0.0 if np.ptp(v) < 1e-12 else (x - v.mean()) / (v.std() + eps)
            for k in segs[(i, s)][1]:
                adv[i, k] = a
    return adv


@pytest.mark.parametrize("seed", range(4))
def test_segments_match_reference_loop(seed):
    rng = np.random.default_rng(seed)
    n, t = 40, 6
    seg = np.cumsum(rng.random((n, t)) < 0.35, axis=1)
    b = TurnBatch.build(
        rng.integers(0, 2, n), rng.integers(0, 5, n), num_turns=rng.integers(0, t + 1, n),
        step_rewards=(rng.random((n, t)) < 0.3) * 1.0, segment_id=seg, max_turns=t,
    )
    for outcome in ("all", "last"):
        gamma = float(rng.uniform(0.5, 1))
        np.testing.assert_allclose(segment_grpo(b, gamma=gamma, outcome=outcome).advantages,
                                   ref_segments(b, gamma, outcome), atol=1e-9)
