"""A discrete-event simulation of one RL pipeline: generator, tools, learner, weight syncs.

A heap of timed events plus the decoder's next finish (`taurl.sim.decoder`) drive a
virtual clock; nothing sleeps. Roles, as the real pipeline has them:

* generator — one continuously batched engine (step a + b·n) holding up to
  max_concurrent episodes; an episode's turns decode there, its tool calls wait outside
  the batch but keep their slot; at a version change it pauses for the weight sync;
* tools — each call's latency (with failures and timeouts) from the episode's plan;
* learner — one step per batch of B episodes (group-complete), taking
  learn_fixed_s + learn_s_per_token · (tokens of the batch's sequences); version v → v+1.

What each schedule does is in `taurl.sim.schedules`. Not modelled: prefill of new turns
(prefix caching makes it small next to decoding; only the re-prefill of interrupted
sequences is charged), KV-cache memory beyond the slot count, network transfer beyond
the fixed sync pause, and learning itself (no rewards: only time and versions).

Outputs (`SimResult`), over the run until `updates` learner steps are done (time T):
trained_tokens_per_s = generated tokens of trained episodes / T; learner_idle_frac =
1 − learner busy time / T; generator_bubble_frac = share of T with no sequence decoding
(paused, waiting for the learner, or every episode in a tool call); staleness of trained
episodes (learner version − oldest token's version; nearest-rank p95); tokens_wasted =
tokens decoded for episodes that were aborted or dropped; length_bias = mean generated
length of trained episodes / mean planned length of every decided episode (trained,
dropped or aborted; those still in flight at T are undecided and left out).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from taurl.data.staleness import nearest_rank
from taurl.errors import Error
from taurl.sim.decoder import Decoder
from taurl.sim.result import SimResult
from taurl.sim.schedules import Schedule
from taurl.sim.state import SimBatch, SimEpisode
from taurl.sim.workload import Workload, draw_episode, top_share


class Simulation:
    def __init__(self, workload: Workload, schedule: Schedule, updates: int, seed: int = 0):
        self.w, self.s = workload.check(), schedule.check()
        if not isinstance(updates, int) or updates < 1:
            raise Error(f"updates must be an integer >= 1, got {updates!r}")
        self.updates, self.seed = updates, seed
        self.B, self.G = workload.batch_episodes, workload.group_size
        self.dec = Decoder(workload.decode_a_s, workload.decode_b_s)
        self.now = 0.0
        self._events: list[tuple[float, int, str, int]] = []
        self._seq = 0
        self.eps: dict[int, SimEpisode] = {}
        self.members: dict[int, list[int]] = {}
        self.group_done: dict[int, int] = {}
        self.next_group = 0
        self.queue: deque[int] = deque()
        self.held: list[int] = []
        # (group, episode) of ready turns over max_batch: a heap
        self.waiting: list[tuple[int, int]] = []
        self.running = 0  # episodes holding a slot
        self.served = self.target = self.pause_version = 0
        self.syncing = self.draining = False
        self.v_learn = 0
        self.learner_busy = False
        self.learner_busy_s = 0.0
        self.accepted = 0
        self.buffer: deque[int] = deque()  # complete groups (async)
        self.ready: deque[list[int]] = deque()  # complete batches (one_step)
        self.batch: SimBatch | None = None
        self.batches_started = 0
        self.tail_shares: list[float] = []
        # (staleness of its oldest trained token, trained tokens)
        self.trained: list[tuple[int, float]] = []
        self.decided_lengths: list[int] = []
        self.wasted = 0.0
        self.dropped = self.aborted = 0
        self.done = False

    # --- the clock ---------------------------------------------------------------------

    def _at(self, t: float, kind: str, eid: int = -1) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, eid))

    def run(self) -> SimResult:
        self._kick()
        while not self.done:
            t_dec = self.dec.next_s()
            t_ev = self._events[0][0] if self._events else math.inf
            if math.isinf(t_dec) and math.isinf(t_ev):
                raise Error(f"simulation of {self.s.label} stalled at t={self.now:.3f}s (a "
                            "schedule bug)")
            self.now = min(t_dec, t_ev)
            self.dec.advance(self.now)
            if t_dec <= t_ev:
                self._turns_done(self.dec.pop_done())
            else:
                _, _, kind, eid = heapq.heappop(self._events)
                getattr(self, f"_on_{kind}")(eid)
        return self._result()

    def _kick(self) -> None:
        if self.s.kind == "async":
            self._admit()
        else:
            self._start_batch()

    # --- episodes ----------------------------------------------------------------------

    def _start_group(self) -> int:
        g = self.next_group
        self.next_group += 1
        self.members[g], self.group_done[g] = [], 0
        for m in range(self.G):
            eid = g * self.G + m
            self.eps[eid] = SimEpisode(eid, g, draw_episode(self.w, self.seed, g, m))
            self.members[g].append(eid)
            self.queue.append(eid)
        self._fill_slots()
        return g

    def _fill_slots(self) -> None:
        while self.queue and self.running < self.w.max_concurrent:
            e = self.eps[self.queue.popleft()]
            self.running += 1
            self._start_turn(e)

    def _start_v(self) -> int:
        """The version the next new token will be decoded with."""
        return self.target if self.draining else self.pause_version if self.syncing else self.served

    def _start_turn(self, e: SimEpisode) -> None:
        if self.draining:  # the old weights only finish what is decoding
            e.state = "held"
            self.held.append(e.eid)
            return
        if self.s.max_batch:  # ready turns queue for the rows, the oldest group first
            e.state = "waiting"
            heapq.heappush(self.waiting, (e.group, e.eid))
            self._fill_rows()
            return
        self._decode(e)

    def _decode(self, e: SimEpisode) -> None:
        e.cur_v, e.turn_done = self._start_v(), 0.0
        if e.start_version is None:
            e.start_version = e.cur_v
        e.state = "decoding"
        self.dec.add(e.eid, e.plan.turn_tokens[e.turn])

    def _turns_done(self, eids: list[int]) -> None:
        for eid in eids:
            e = self.eps[eid]
            if e.state != "decoding":  # aborted by an earlier finish of this same instant
                continue
            e.decoded += e.plan.turn_tokens[e.turn]
            e.record(e.plan.turn_tokens[e.turn] - e.turn_done)
            e.turn += 1
            if e.turn < len(e.plan.turn_tokens):
                e.state = "tool"
                self._at(self.now + e.plan.tool_s[e.turn - 1], "tool_done", eid)
            else:
                self._complete(e)
        self._fill_rows()
        if self.draining and self.dec.n == 0 and not self.syncing:
            self._begin_sync()

    def _fill_rows(self) -> None:
        """max_batch: waiting turns take the free rows, the oldest group first (not while
        draining)."""
        while self.waiting and not self.draining and self.dec.n < self.s.max_batch:
            _, eid = heapq.heappop(self.waiting)
            if self.eps[eid].state == "waiting":  # (an aborted one is left in the heap)
                self._decode(self.eps[eid])

    def _on_tool_done(self, eid: int) -> None:
        e = self.eps[eid]
        if e.state == "tool":  # an aborted episode's call returns to nobody
            self._start_turn(e)

    def _complete(self, e: SimEpisode) -> None:
        e.state = "done"
        self.running -= 1
        self.group_done[e.group] += 1
        if self.batch is not None and e.group in self.batch.groups:
            self.batch.finish_times.append(self.now)
        if self.group_done[e.group] == self.G:
            self._group_complete(e.group)
        self._fill_slots()
        if self.s.kind == "async":
            self._admit()

    def _abort_group(self, g: int) -> None:
        for eid in self.members[g]:
            e = self.eps[eid]
            if e.state == "decoding":  # (its turn may have just finished, in this same instant)
                left = self.dec.remove(eid) if eid in self.dec.finish else 0.0
                e.decoded += e.plan.turn_tokens[e.turn] - left
            if e.state in ("decoding", "tool", "held", "waiting"):
                self.running -= 1
            if e.state == "queued":
                self.queue.remove(eid)
            e.state = "aborted"
            self.wasted += e.decoded
            self.aborted += 1
            self.decided_lengths.append(e.plan.gen_tokens)
        self._fill_rows()

    # --- admission ---------------------------------------------------------------------

    def _start_batch(self) -> None:
        """Batch schedules: open the next batch when the rule of the schedule allows."""
        if self.batch is not None or self.syncing or self.done:
            return
        k = self.batches_started
        if self.s.kind in ("sync", "overprovision") and (self.learner_busy
                                                         or self.served < self.v_learn):
            return
        if self.s.kind == "one_step" and k > self.served + 1:
            return
        need = self.w.tasks_per_batch
        n = math.ceil((1 + self.s.overprovision) * need) if self.s.kind == "overprovision" else need
        self.batches_started += 1
        self.batch = SimBatch(k, [], need, t0=self.now)
        for _ in range(n):
            self.batch.groups.append(self._start_group())

    def _admit(self) -> None:
        """Async: AReaL's capacity rule (module `taurl.sim.schedules`), whole groups at a time."""
        if self.done:
            return
        while True:
            cap = min(self.w.max_concurrent - self.running,
                      (self.s.eta + self._start_v() + 1) * self.B
                      - (self.accepted + self.running + len(self.queue)))
            if cap < self.G:
                return
            self._start_group()

    def _group_complete(self, g: int) -> None:
        if self.s.kind == "async":
            self.accepted += self.G
            self.buffer.append(g)
            self._try_learn()
            return
        b = self.batch
        assert b is not None and g in b.groups
        b.done.append(g)
        if len(b.done) < b.needed:
            return
        for other in b.groups:
            if other not in b.done:
                self._abort_group(other)
        if self.s.kind == "sync":
            self._tail_share(b)
        self.batch = None
        if self.s.kind == "one_step":
            self.ready.append(b.done)
            self._try_learn()
            if self.target > self.served:
                self._begin_sync()
            else:
                self._start_batch()
        else:
            self._learn(b.done)

    def _tail_share(self, b: SimBatch) -> None:
        t = sorted(b.finish_times)
        k = max(1, math.ceil(0.95 * len(t)))
        if t[-1] > b.t0:
            self.tail_shares.append((t[-1] - t[k - 1]) / (t[-1] - b.t0))

    # --- the learner and weight syncs ------------------------------------------------

    def _try_learn(self) -> None:
        if self.learner_busy or self.done:
            return
        if self.s.kind == "one_step" and self.ready:
            self._learn(self.ready.popleft())
        elif self.s.kind == "async":
            need, chosen = self.w.tasks_per_batch, []
            while len(chosen) < need and self.buffer:
                g = self.buffer.popleft()
                oldest = min(self.eps[e].start_version for e in self.members[g])
                if self.s.stale == "drop" and self.v_learn - oldest > self.s.eta:
                    # checked again at consumption
                    for eid in self.members[g]:
                        self.eps[eid].state = "dropped"
                        self.wasted += self.eps[eid].decoded
                        self.decided_lengths.append(self.eps[eid].plan.gen_tokens)
                    self.dropped += self.G
                    self.accepted -= self.G
                else:
                    chosen.append(g)
            if len(chosen) < need:
                self.buffer.extendleft(reversed(chosen))
                self._admit()
                return
            self._learn(chosen)

    def _learn(self, groups: list[int]) -> None:
        eps = [self.eps[eid] for g in groups for eid in self.members[g]]
        for e in eps:
            self.decided_lengths.append(e.plan.gen_tokens)
            fresh = [(v, n) for v, n in e.segs if self.v_learn - v <= self.s.bound]
            kept = sum(n for _, n in fresh)
            if self.s.stale == "drop" and abs(kept - e.plan.gen_tokens) > 1e-6:
                raise Error(f"{self.s.label}: episode {e.eid} has tokens older than the bound "
                            f"{self.s.bound} in the learner's batch: a schedule bug")
            self.wasted += e.decoded - kept  # stale tokens masked from the loss
            if not fresh:  # every token masked: nothing of it is trained
                e.state = "masked"
                self.dropped += 1
                continue
            e.state = "trained"
            age = self.v_learn - int(min(v for v, _ in fresh))
            if age < 0:
                raise Error(f"{self.s.label}: episode {e.eid} is newer than the learner: a "
                            "schedule bug")
            self.trained.append((age, kept))
        dt = self.w.learn_fixed_s + self.w.learn_s_per_token * sum(e.plan.total_tokens for e in eps)
        self.learner_busy = True
        self.learner_busy_s += dt
        self._at(self.now + dt, "learn_done")

    def _on_learn_done(self, _: int) -> None:
        self.learner_busy = False
        self.v_learn += 1
        if self.v_learn == self.updates:
            self.done = True
            return
        self.target = self.v_learn
        self._push()
        self._try_learn()
        if self.s.kind == "async":
            self._admit()

    def _push(self) -> None:
        """Bring the generator to `target` as the schedule says."""
        if self.syncing or self.target <= self.served:
            return
        if self.s.kind == "one_step" and self.batch is not None:
            return  # loaded at the batch boundary
        if self.s.kind == "async" and not self.s.interrupt:
            self.draining = True
            if self.dec.n == 0:
                self._begin_sync()
            return
        self._begin_sync()

    def _begin_sync(self) -> None:
        extra = 0.0
        if self.s.interrupt:  # interrupted sequences recompute their context on the new weights
            ctx = 0
            for eid, finish in self.dec.finish.items():
                e = self.eps[eid]
                ctx += e.plan.context_before(e.turn)
                done = e.plan.turn_tokens[e.turn] - max(0.0, finish - self.dec.progress)
                # the segment splits here: the rest is the new version's
                e.record(done - e.turn_done)
                e.turn_done, e.cur_v = done, self.target
            extra = self.w.reprefill_s_per_token * ctx
        self.syncing, self.dec.paused = True, True
        self.pause_version = self.target
        self._at(self.now + self.w.sync_s + extra, "sync_done")

    def _on_sync_done(self, _: int) -> None:
        self.syncing = self.dec.paused = self.draining = False
        self.served = self.pause_version
        held, self.held = self.held, []
        for eid in held:
            self._start_turn(self.eps[eid])
        self._fill_rows()
        if self.target > self.served and self.s.kind == "async":
            # one_step loads the newest at its next boundary
            self._push()
        if self.s.kind == "async":
            self._admit()
        else:
            self._start_batch()

    # --- the result ----------------------------------------------------------------------

    def _result(self) -> SimResult:
        T = self.now
        ages = [a for a, _ in self.trained]
        lengths = [n for _, n in self.trained]
        trained_tokens = round(sum(lengths))
        decoded = self.dec.tokens
        gen_mean = sum(self.decided_lengths) / max(len(self.decided_lengths), 1)
        return SimResult(
            schedule=self.s.label, kind=self.s.kind, eta=self.s.bound, interrupt=self.s.interrupt,
            overprovision=self.s.overprovision, stale=self.s.stale, updates=self.updates,
            seed=self.seed, sim_time_s=T, trained_tokens=trained_tokens,
            trained_tokens_per_s=trained_tokens / T if T > 0 else 0.0,
            learner_idle_frac=1.0 - self.learner_busy_s / T if T > 0 else 0.0,
            generator_bubble_frac=1.0 - self.dec.busy_s / T if T > 0 else 0.0,
            generator_mean_batch=self.dec.slot_s / T if T > 0 else 0.0,
            staleness_mean=sum(ages) / max(len(ages), 1),
            staleness_p95=float(nearest_rank(ages, 0.95)),
            max_staleness=float(max(ages, default=0)), tokens_wasted=round(self.wasted),
            tokens_wasted_frac=self.wasted / decoded if decoded > 0 else 0.0,
            episodes_trained=len(self.trained), episodes_dropped=self.dropped,
            episodes_aborted=self.aborted,
            length_bias=(trained_tokens / max(len(lengths), 1)) / gen_mean if gen_mean > 0 else 1.0,
            tail_time_share=(sum(self.tail_shares) / len(self.tail_shares) if self.tail_shares
                             else None),
            top5_token_share=top_share(self.decided_lengths) if self.decided_lengths else 0.0,
        )


def simulate(workload: Workload, schedule: Schedule, updates: int = 20, seed: int = 0) -> SimResult:
    """One schedule on `workload` for `updates` learner steps (module docstring)."""
    return Simulation(workload, schedule, updates, seed).run()


def compare(workload: Workload, schedules: list[Schedule], updates: int = 20,
            seed: int = 0) -> list[SimResult]:
    """Every schedule on the same episodes (same seed), with speedup_vs_sync against ``sync``."""
    from dataclasses import replace

    results = [simulate(workload, s, updates, seed) for s in schedules]
    sync = next((r for r in results if r.kind == "sync"),
                None) or simulate(workload, Schedule("sync"), updates, seed)
    base = sync.trained_tokens_per_s
    return [replace(r, speedup_vs_sync=r.trained_tokens_per_s / base if base > 0 else None)
            for r in results]
