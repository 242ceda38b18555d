"""A continuously batched decoder on a virtual clock (no real sleeping).

Every decode step emits one token for each sequence in the batch and takes

    step(n) = a + b·n      (n = sequences decoding; a: reading the weights once per step,
                            b: per-sequence attention/KV work — the usual memory-bound model
                            of continuous batching, Orca, OSDI '22; vLLM, arXiv 2309.06180)

Between two events n is constant, so progress is fluid: the decode "progress" P (tokens
emitted per sequence since the start) grows at 1/step(n) per second, and a sequence that
joined at progress P0 needing k tokens finishes at P = P0 + k. The next finish time is
then exact — (min finish − P)·step(n) from now — and the simulator never steps token by
token. While `paused` (a weight sync), P does not move.
"""

from __future__ import annotations

import heapq
import math

_EPS = 1e-7  # tokens: float slack when a finish lands exactly on an event


class Decoder:
    def __init__(self, a: float, b: float):
        self.a, self.b = a, b
        self.t = 0.0  # virtual time of the last `advance`
        self.progress = 0.0  # P
        self.finish: dict[int, float] = {}  # episode id -> finish progress of its current turn
        self._heap: list[tuple[float, int]] = []
        self.paused = False
        self.busy_s = 0.0  # time with at least one sequence decoding (not paused)
        self.slot_s = 0.0  # ∫ n dt: sequence-seconds of decoding
        self.tokens = 0.0  # tokens emitted (fluid; integral at each finish)
        self.peak = 0  # the most sequences decoding at once

    @property
    def n(self) -> int:
        return len(self.finish)

    def step_s(self) -> float:
        return self.a + self.b * self.n

    def advance(self, t: float) -> None:
        """Move the clock to `t` (>= the last time); decoding progresses unless paused."""
        dt = t - self.t
        if dt > 0 and self.finish and not self.paused:
            dp = dt / self.step_s()
            self.progress += dp
            self.busy_s += dt
            self.slot_s += dt * self.n
            self.tokens += dp * self.n
        self.t = max(self.t, t)

    def add(self, eid: int, tokens: int) -> None:
        f = self.progress + tokens
        self.finish[eid] = f
        self.peak = max(self.peak, len(self.finish))
        heapq.heappush(self._heap, (f, eid))

    def remove(self, eid: int) -> float:
        """Take `eid` out mid-turn (abort); returns the tokens of its turn still undecoded."""
        return max(0.0, self.finish.pop(eid) - self.progress)

    def _top(self) -> tuple[float, int] | None:
        while self._heap:
            f, eid = self._heap[0]
            if self.finish.get(eid) == f:
                return f, eid
            heapq.heappop(self._heap)  # removed, or a stale entry of an earlier turn
        return None

    def next_s(self) -> float:
        """Virtual time of the next finish (inf when paused or idle)."""
        top = self._top()
        if self.paused or top is None:
            return math.inf
        return self.t + max(0.0, top[0] - self.progress) * self.step_s()

    def pop_done(self) -> list[int]:
        """Episodes whose turn has finished by now, in finish order (called at `next_s`).

        At least the earliest one: when its finish lies below the clock's float resolution
        the clock cannot move onto it, and it is due all the same.
        """
        out = []
        while (top := self._top()) is not None and (not out or top[0] <= self.progress + _EPS):
            if out or top[0] <= self.progress + _EPS or self.next_s() <= self.t:
                heapq.heappop(self._heap)
                del self.finish[top[1]]
                out.append(top[1])
            else:
                break
        return out
