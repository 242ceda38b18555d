"""From turns to tokens and back: where each turn's action tokens are in the token stream.

Estimators give one advantage per turn; the loss needs one per token. Each turn owns
one action segment (`Turn.action_segment`), so the map token -> turn is fixed by the record:
action tokens get their turn's advantage, every other token (prompt, observation,
template, padding) gets 0 and is masked out of the loss anyway.

A partial rollout (`RolloutConfig.resume_aborted`) splits one action where the policy
version changed: the turn's `action_segment` is the first piece and the pieces that follow
it directly (action segments no turn names, each of a newer version than the one before)
continue the same action. Any other action segment no turn names is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from taurl.data.trajectory import Trajectory
from taurl.errors import ContractError


def turn_spans(traj: Trajectory) -> np.ndarray:
    """(T, 2) int64: [start, end) positions of each turn's action tokens in `traj.token_ids`.

    ``start - 1`` is the last token of the state the action was taken in (where a critic
    reads V(s_t)).
    """
    starts = np.cumsum([0] + [len(s.token_ids) for s in traj.segments])
    return np.array([[starts[t.action_segment],
                      starts[_action_end(traj, t.action_segment)]] for t in traj.turns],
                    dtype=np.int64).reshape(-1, 2)


def _action_end(traj: Trajectory, first: int) -> int:
    """One past the last segment of the action that starts at segment `first` (its pieces)."""
    owned = {t.action_segment for t in traj.turns}
    end = first + 1
    while end < len(traj.segments) and end not in owned and _continues(traj, end):
        end += 1
    return end


def _continues(traj: Trajectory, i: int) -> bool:
    """Segment `i` is a later piece of the action before it: an action right after an
    action, sampled by a newer policy version (a partial rollout's split)."""
    seg, prev = traj.segments[i], traj.segments[i - 1] if i > 0 else None
    return (seg.kind == "action" and prev is not None and prev.kind == "action"
            and seg.policy_version is not None
            and prev.policy_version is not None and seg.policy_version > prev.policy_version)


def token_turn_index(traj: Trajectory) -> np.ndarray:
    """(L,) int64: the turn whose action segment holds each token, −1 for all other tokens.

    Raises ContractError(rule="untracked_action") when an action segment belongs to no
    turn: its tokens would be trained with no advantage.
    """
    owner = {t.action_segment: k for k, t in enumerate(traj.turns)}
    per_segment = np.full(len(traj.segments), -1, dtype=np.int64)
    for i, seg in enumerate(traj.segments):
        if seg.kind != "action":
            continue
        k = owner.get(i, -1)
        if k < 0 and _continues(traj, i):  # a later piece of the same action
            k = per_segment[i - 1]
        if k < 0 and seg.token_ids:
            raise ContractError("untracked_action", f"episode {traj.episode_id}: action segment "
                                                    f"{i} belongs to no "
                                "turn; record a Turn for every model action")
        per_segment[i] = k
    return np.repeat(per_segment, [len(seg.token_ids) for seg in traj.segments])


def padded_token_turn_index(trajs: Sequence[Trajectory], length: int | None = None) -> np.ndarray:
    """(N, L) int64 `token_turn_index` of each trajectory, right-padded with −1 to `length`."""
    rows = [token_turn_index(t) for t in trajs]
    width = max((r.size for r in rows), default=0) if length is None else length
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        if r.size > width:
            raise ContractError("token_length", f"trajectory {i} has {r.size} tokens, more than "
                                                f"length={width}")
        out[i, : r.size] = r
    return out


def broadcast_to_tokens(advantages: np.ndarray, turn_index: np.ndarray) -> np.ndarray:
    """Per-token advantages: ``advantages[..., turn_index]`` where turn_index >= 0, else 0.

    advantages: (T,) with turn_index (L,), or (N, T) with turn_index (N, L). Returns float64
    of turn_index's shape. Slices of a row (a trajectory split over several training rows)
    index the same way.
    """
    adv = np.asarray(advantages, dtype=np.float64)
    idx = np.asarray(turn_index)
    if adv.ndim == 1:
        adv, idx2 = adv[None, :], idx[None, :]
    else:
        idx2 = idx
    if adv.shape[0] != idx2.shape[0]:
        raise ContractError("token_broadcast", f"{adv.shape[0]} rows of advantages for "
                                               f"{idx2.shape[0]} rows of tokens")
    if idx2.size and idx2.min() < -1:
        raise ContractError("token_broadcast", "turn indexes are >= 0 for action tokens and -1 "
                                               "elsewhere; "
                            "build them with token_turn_index")
    if idx2.size and idx2.max() >= adv.shape[1]:
        raise ContractError("token_broadcast", f"a token belongs to turn {int(idx2.max())} but "
                                               "advantages have "
                            f"{adv.shape[1]} turns; build both from the same trajectories")
    # a zero column appended at the end: index −1 (not an action token) picks it, in one pass
    padded = np.concatenate([adv, np.zeros((adv.shape[0], 1))], axis=1)
    return np.take_along_axis(padded, idx2, axis=1).reshape(idx.shape)


def turn_sums(token_values: np.ndarray, turn_index: np.ndarray, num_turns: int) -> np.ndarray:
    """(N, T) sum of `token_values` (N, L) over each turn's action tokens.

    The reverse of `broadcast_to_tokens`, e.g. to turn per-token KL penalties
    (`taurl.train.objectives.kl.kl_reward_penalty`) into per-turn step rewards.
    """
    vals = np.asarray(token_values, dtype=np.float64)
    idx = np.asarray(turn_index)
    n = idx.shape[0]
    keep = idx >= 0
    flat = (np.arange(n)[:, None] * num_turns + idx)[keep]
    return np.bincount(flat, weights=vals[keep], minlength=n * num_turns).reshape(n, num_turns)
