"""A chain's token streams, one at a time: what a model reads and the learner trains on.

A record's flat views (`Trajectory.token_ids`, ...) put a chain's streams one after the
other, which is no sequence a model ever saw. `stream_views` cuts the record at its
`stream_starts` into one record per stream, each a one-stream `Trajectory` whose ids are
exactly that stream's (its prompt rendered once, its sampled ids as sampled) and whose
messages are the chat that stream renders. `stream_turns` says which of the episode's turns
each stream holds, so that per-turn credit computed on the whole episode reaches every
stream's action tokens (`taurl.train.chains`).

`join_streams` is the converse: records of one episode, each one stream (the proxy's
captured chains), become one chain record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from taurl.data.streams import StreamStart
from taurl.data.trajectory import Trajectory
from taurl.errors import ContractError


def _bounds(traj: Trajectory) -> tuple[list[int], list[int]]:
    seg = [0] + [s.segment for s in traj.stream_starts] + [len(traj.segments)]
    msg = [0] + [s.message for s in traj.stream_starts] + [len(traj.messages)]
    return seg, msg


def stream_turns(traj: Trajectory) -> list[list[int]]:
    """For each stream, the positions in `traj.turns` of the turns whose action it holds."""
    seg, _ = _bounds(traj)
    out: list[list[int]] = [[] for _ in range(traj.num_streams)]
    for k, t in enumerate(traj.turns):
        out[_which(seg, t.action_segment)].append(k)
    return out


def _which(bounds: list[int], segment: int) -> int:
    for j in range(len(bounds) - 1):
        if bounds[j] <= segment < bounds[j + 1]:
            return j
    raise ContractError("turn_segment", f"segment {segment} is outside the record")


def stream_views(traj: Trajectory) -> list[Trajectory]:
    """One one-stream record per stream of `traj` (``[traj]`` for a chain of one).

    A view keeps the episode's identity, outcome and metadata (plus ``metadata["stream"]``,
    its position, and ``metadata["stream_reason"]``, why it began); its turns are the
    episode's turns whose action it holds, re-indexed into its own segments. An observation
    that fell into a later stream's prompt (a compaction right after it) is no segment of
    this view: its turn says ``observation_segment`` None.
    """
    if not traj.stream_starts:
        return [traj]
    seg, msg = _bounds(traj)
    owned = stream_turns(traj)
    views = []
    for j in range(traj.num_streams):
        a, b = seg[j], seg[j + 1]
        turns = tuple(_rebased(traj.turns[k], a, b) for k in owned[j])
        reason = traj.stream_starts[j - 1].reason if j else ""
        views.append(dataclasses.replace(
            traj, segments=traj.segments[a:b], turns=turns,
            messages=traj.messages[msg[j]:msg[j + 1]],
            stream_starts=(), metadata={**traj.metadata, "stream": j, "stream_reason": reason}))
    return views


def _rebased(turn, a: int, b: int):
    o = turn.observation_segment
    return dataclasses.replace(turn, action_segment=turn.action_segment - a,
                               observation_segment=o - a if o is not None and a <= o < b else None)


def join_streams(parts: Sequence[Trajectory], reasons: Sequence[str], **changes) -> Trajectory:
    """One chain record from one-stream records of one episode, in order.

    reasons[k]: why part k+1 began (``len(parts) - 1`` names). The last part gives the
    identity, outcome and metadata (`changes` overrides them, e.g. ``episode_id=``); turns
    are renumbered across the chain.
    """
    if not parts or any(p.stream_starts for p in parts) or len(reasons) != len(parts) - 1:
        raise ContractError("stream_start", "join_streams takes one-stream records and one reason "
                                            "per later "
                            f"stream: {len(parts)} records, {len(reasons)} reasons")
    segments, messages, turns, starts = [], [], [], []
    for k, p in enumerate(parts):
        if k:
            starts.append(StreamStart(segment=len(segments), message=len(messages),
                                      reason=reasons[k - 1]))
        base = len(segments)
        for t in p.turns:
            o = t.observation_segment
            turns.append(dataclasses.replace(t, index=len(turns),
                                             action_segment=t.action_segment + base,
                                             observation_segment=None if o is None else o + base))
        segments.extend(p.segments)
        messages.extend(p.messages)
    timings = {k: sum(p.timings.get(k, 0.0) for p in parts) for k in parts[-1].timings}
    return dataclasses.replace(parts[-1], segments=tuple(segments), turns=tuple(turns),
                               messages=tuple(messages),
                               stream_starts=tuple(starts), timings=timings, **changes)
