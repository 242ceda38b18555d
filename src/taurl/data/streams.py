"""The chain of token streams of one episode: where each later stream starts, and its rule.

An episode is a chain of token streams (docs/long_horizons.md): after a compaction, or a
chat template that rewrites history, the next prompt no longer extends the stream, so a new
one begins with a prompt rendered once. `StreamStart` records where and why;
`stream_problems` is the ledger's ``stream_start`` rule. `taurl.data.chains` splits a record
into its streams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taurl.data.json_fields import _is
from taurl.data.stop_reason import NAME_PATTERN

# the ones taurl writes; the set is open
STREAM_REASONS = ("compaction", "template_rewrite", "agent_rewrite")


@dataclass(frozen=True)
class StreamStart:
    """Where a later token stream of a chain begins, and why (module docstring).

    reason: a snake_case name; the loop's are "compaction" (the context was compacted),
    "template_rewrite" (the chat template re-rendered history it cannot extend) and the
    proxy's "agent_rewrite" (the agent sent a history that does not extend the last call's).
    """

    segment: int  # index in `Trajectory.segments` of the stream's prompt segment
    message: int  # index in `Trajectory.messages` of the stream's first message
    reason: str



def stream_problems(traj: Any) -> list[str]:
    """How `stream_starts` breaks the chain rule: each later stream starts at a prompt segment
    and a message, both strictly after the last stream's, with a snake_case reason; and a
    prompt segment anywhere but at a stream start would hide a stream the learner cannot see."""
    out: list[str] = []
    seg, msg = 0, 0
    for k, s in enumerate(traj.stream_starts):
        where = f"stream_starts[{k}]"
        if not (_is(s.segment, int) and _is(s.message, int)) or not (
                seg < s.segment < len(traj.segments) and msg < s.message <= len(traj.messages)):
            out.append(f"{where}: segment {s.segment!r} / message {s.message!r} must come after "
                       f"the previous stream's ({seg} / {msg}) and inside the record")
            continue
        if traj.segments[s.segment].kind != "prompt":
            out.append(f"{where}: segment {s.segment} is {traj.segments[s.segment].kind!r}; a "
                       "stream starts with its prompt")
        if not isinstance(s.reason, str) or not NAME_PATTERN.match(s.reason):
            out.append(
                f"{where}: reason {s.reason!r} must be a snake_case name ('compaction', ...)"
            )
        seg, msg = s.segment, s.message
    starts = {s.segment for s in traj.stream_starts}
    extra = [i for i, s in enumerate(traj.segments) if i and s.kind == "prompt" and i not in starts]
    if extra:
        out.append(
            f"prompt segment(s) {extra} begin no stream; a new prompt starts a new stream, "
            "which stream_starts records (segment, message, reason)"
        )
    return out
