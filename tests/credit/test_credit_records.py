"""From trajectory records to the per-turn batch and back to tokens; process shaping."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from taurl.credit import (
    TurnBatch,
    broadcast_to_tokens,
    compute_advantages,
    padded_token_turn_index,
    score_turns,
    shape_process_rewards,
    stable_hash,
    token_turn_index,
    turn_spans,
    turn_sums,
)
from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn, validate_trajectory
from taurl.errors import ConfigError, ContractError


def make_traj(
    episode: str, group: str, turns: list[dict], reward: float, prompt: str = "find the capital",
    metadata: dict | None = None, extra_action: bool = False,
) -> Trajectory:
    """prompt (3 ids) then per turn: action (len(action_text) ids), observation (2 ids)
    except last; template."""
    segs = [Segment("prompt", (1, 2, 3))]
    out = []
    for k, t in enumerate(turns):
        n = len(t["action"])
        segs.append(Segment("action", tuple(range(10, 10 + n)), tuple([-0.5] * n), 0))
        a_idx = len(segs) - 1
        o_idx = None
        if k < len(turns) - 1:
            segs.append(Segment("observation", (7, 8)))
            o_idx = len(segs) - 1
        out.append(
            Turn(
                index=k, action_text=t["action"], action=t.get("parsed", {"kind": "search"}),
                observation_text=t.get("obs", "") if o_idx is not None else "",
                action_segment=a_idx, observation_segment=o_idx, finish_reason="stop",
                env_reward=t.get("r", 0.0),
            )
        )
    if extra_action:
        segs.append(Segment("action", (5,), (-0.1,), 0))
    segs.append(Segment("template", (9,)))
    traj = Trajectory(
        episode_id=episode, run_id="r", task_id=group, group_id=group, split="train",
        env_name="search-v0", env_version="1", seed=0, segments=tuple(segs), turns=tuple(out),
        messages=({"role": "user", "content": prompt}, {"role": "assistant", "content": "..."}),
        terminated=True, truncated=False, stop_reason=StopReason.ANSWERED, reward=reward,
        metadata=metadata or {},
    )
    return traj if extra_action else validate_trajectory(traj)


TRAJS = [
    make_traj(
        "e1", "task-b", [{"action": "q1", "obs": "paris"}, {"action": "ans", "r": 1.0}], reward=1.0
    ),
    make_traj(
        "e2",
        "task-b",
        [
            {"action": "q2", "obs": "paris"},
            {"action": "q3", "obs": "lyon"},
            {"action": "ans", "r": 0.0},
        ],
        reward=0.0,
    ),
    make_traj(
        "e3",
        "task-a",
        [
            {"action": "q1", "obs": "rome", "parsed": {"kind": "search", "subgoal_end": True}},
            {"action": "ans", "r": 0.5},
        ],
        reward=0.75,
    ),
]


def test_from_trajectories_fields():
    b = TurnBatch.from_trajectories(TRAJS)
    np.testing.assert_array_equal(b.turn_mask.sum(1), [2, 3, 2])
    np.testing.assert_array_equal(b.group, [1, 1, 0])  # sorted labels: task-a = 0, task-b = 1
    assert b.group_names == ("task-a", "task-b") and b.episode_ids == ("e1", "e2", "e3")
    # the outcome arrives as the last turn's env_reward (as in real rollouts); the batch moves
    # it into `rewards` with what no turn carries (e3: 0.5 on its last turn + 0.25 left over)
    np.testing.assert_allclose(b.rewards, [1, 0, 0.75])
    np.testing.assert_allclose(b.scores, [1, 0, 0.75])  # sums unchanged
    np.testing.assert_allclose(b.step_rewards, 0.0)
    np.testing.assert_allclose(b.turn_rewards()[0], [0, 1, 0])
    # turn 0: the prompt for everyone; turn 1 of e1 and e2 both saw "paris" -> the same state
    assert b.state_hash[0, 0] == b.state_hash[1, 0] == b.state_hash[2, 0]
    assert b.state_hash[0, 1] == b.state_hash[1, 1] == stable_hash("paris") != b.state_hash[2, 1]
    assert b.action_hash[0, 0] == b.action_hash[2, 0] == stable_hash("q1")
    assert b.state_text[1] == ("user: find the capital", "paris", "lyon")
    np.testing.assert_array_equal(b.segment_id[2, :2], [0, 1])  # subgoal_end on turn 0 of e3
    np.testing.assert_array_equal(b.segment_id[0], [0, 0, 0])


def test_history_state_separates_different_paths():
    b = TurnBatch.from_trajectories(TRAJS, state="history")
    assert b.state_hash[0, 0] == b.state_hash[1, 0]
    assert b.state_hash[0, 1] != b.state_hash[1, 1]  # same observation, different action before it


def test_subgoal_boundaries_from_metadata():
    t = make_traj(
        "e4", "g", [{"action": "a", "obs": "x"}, {"action": "b", "obs": "y"}, {"action": "c"}], 1.0,
        metadata={"subgoal_end": [1]},
    )
    np.testing.assert_array_equal(TurnBatch.from_trajectories([t]).segment_id[0], [0, 0, 1])


def test_stable_hash_is_fixed_across_processes():
    # blake2b-64 of "paris", read little endian, signed: a constant, unlike Python's salted hash()
    digest = hashlib.blake2b(b"paris", digest_size=8).digest()
    assert (
        stable_hash("paris") == int.from_bytes(digest, "little", signed=True) == 1657316678316814225
    )


def test_batch_validation_says_what_is_wrong():
    with pytest.raises(ContractError, match="prefix"):
        TurnBatch.build([1, 0], [0, 0], turn_mask=[[True, False], [False, True]])
    with pytest.raises(ContractError, match="NaN"):
        TurnBatch.build([np.nan], [0])
    with pytest.raises(ContractError, match="shape"):
        TurnBatch.build([1, 0], [0, 0], num_turns=[1, 1], step_rewards=np.zeros((3, 1)))
    with pytest.raises(ContractError, match="max_turns"):
        TurnBatch.from_trajectories(TRAJS, max_turns=2)


def test_batch_arrays_are_read_only_and_callers_arrays_untouched():
    r = np.array([1.0, 0.0])
    b = TurnBatch.build(r, [0, 0])
    with pytest.raises(ValueError):
        b.rewards[0] = 5
    r[1] = 2.0  # the caller's array stays writable
    assert r.flags.writeable


def test_token_turn_index_and_broadcast():
    t = TRAJS[0]  # prompt 3 | action "q1" 2 | obs 2 | action "ans" 3 | template 1
    idx = token_turn_index(t)
    np.testing.assert_array_equal(idx, [-1, -1, -1, 0, 0, -1, -1, 1, 1, 1, -1])
    np.testing.assert_array_equal(idx >= 0, np.array(t.action_mask, bool))
    np.testing.assert_allclose(broadcast_to_tokens(np.array([0.5, -1.0]), idx),
                               [0, 0, 0, 0.5, 0.5, 0, 0, -1, -1, -1, 0])
    np.testing.assert_array_equal(turn_spans(t), [[3, 5], [7, 10]])


def test_padded_broadcast_matches_loop_and_turn_sums_inverts_it():
    b = TurnBatch.from_trajectories(TRAJS)
    credit = compute_advantages(b, "grpo")
    idx = padded_token_turn_index(TRAJS)
    tok = broadcast_to_tokens(credit.advantages, idx)
    for i, tr in enumerate(TRAJS):
        for p, k in enumerate(token_turn_index(tr)):
            assert tok[i, p] == (credit.advantages[i, k] if k >= 0 else 0.0)
    assert np.all(tok[:, idx.shape[1]:] == 0)
    # summing a per-token quantity back per turn: each turn's action-token count
    counts = turn_sums(np.ones(idx.shape), idx, b.max_turns)
    np.testing.assert_array_equal(counts[1], [2, 2, 3])


def test_action_segment_without_turn_is_refused():
    bad = make_traj("e9", "g", [{"action": "a"}], 1.0, extra_action=True)
    with pytest.raises(ContractError, match="untracked_action"):
        token_turn_index(bad)


def test_process_shaping_is_weighted_clipped_and_kept_apart():
    b = TurnBatch.from_trajectories(TRAJS)
    # rule scorer: +1 per search turn; the last turn of e2 scores 5 (clipped),
    # e1's answer -3 (clipped)
    table = {("e1", 1): -3.0, ("e2", 2): 5.0}
    scores = score_turns(TRAJS, lambda tr, t: table.get((tr.episode_id, t), 1.0), b.max_turns)
    shaped, stats = shape_process_rewards(b, scores, weight=0.1, clip=0.2)
    # 0.1·1 = 0.1 kept; 0.1·5 = 0.5 -> 0.2; 0.1·(-3) = -0.3 -> -0.2
    np.testing.assert_allclose(
        shaped.process_rewards, [[0.1, -0.2, 0], [0.1, 0.1, 0.2], [0.1, 0.1, 0]]
    )
    np.testing.assert_allclose(shaped.rewards, b.rewards)  # outcome untouched
    np.testing.assert_allclose(shaped.step_rewards, b.step_rewards)
    np.testing.assert_allclose(shaped.scores, b.scores + [-0.1, 0.4, 0.2])
    assert stats["learn/shaping_clip_frac"] == pytest.approx(2 / 7)
    with pytest.raises(ConfigError):
        shape_process_rewards(b, scores, weight=0.1, clip=0.0)
    with pytest.raises(ContractError, match="scorer"):
        shape_process_rewards(b, np.full(b.turn_mask.shape, np.nan))
