"""The mutable records `taurl.sim.simulator.Simulation` moves through its virtual clock.

Split from the simulator so that module holds the event loop alone; these are plain state
(an episode's progress by policy version, a learner batch being filled).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from taurl.sim.workload import EpisodePlan


@dataclass
class SimEpisode:
    """One episode as the simulator moves it: its turn, state and decoded tokens by version."""

    eid: int
    group: int
    plan: EpisodePlan
    turn: int = 0
    start_version: int | None = None  # version of its first token
    decoded: float = 0.0  # tokens decoded so far
    # queued | decoding | waiting | tool | held | done, then trained | masked | dropped | aborted
    state: str = "queued"
    # [version, tokens] in order, split where it changes
    segs: list[list[float]] = field(default_factory=list)
    cur_v: int = 0  # version decoding the current turn
    turn_done: float = 0.0  # tokens of the current turn already in `segs`

    def record(self, tokens: float) -> None:
        if tokens <= 0:
            return
        if self.segs and self.segs[-1][0] == self.cur_v:
            self.segs[-1][1] += tokens
        else:
            self.segs.append([self.cur_v, tokens])


@dataclass
class SimBatch:
    """One learner batch: its groups, how many episodes it needs and which are done."""

    index: int
    groups: list[int]
    needed: int
    done: list[int] = field(default_factory=list)
    t0: float = 0.0
    finish_times: list[float] = field(default_factory=list)
