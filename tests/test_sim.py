"""The discrete-event simulator: hand-computed cases, staleness bounds, determinism, accounting."""

from __future__ import annotations

import dataclasses

import pytest

from taurl.errors import ConfigError, Error
from taurl.sim import Schedule, Workload, compare, draw_episode, simulate, standard_schedules
from taurl.sim.decoder import Decoder

# a heavy tail, small enough to simulate in well under a second per schedule
TAIL = Workload(gen_median_tokens=300, gen_sigma=1.6, max_gen_tokens=8192, learn_s_per_token=1e-3)


def _const(**kw) -> Workload:
    """Constant lengths, one turn, no tools: every quantity is arithmetic."""
    base = dict(
        gen_sigma=0.0, gen_median_tokens=100, max_turns=1, tasks_per_batch=2, group_size=4,
        decode_a_s=0.01, decode_b_s=0.001, sync_s=0.5, learn_fixed_s=0.2, learn_s_per_token=1e-4,
        prompt_tokens=20,
    )
    return Workload(**{**base, **kw})


def test_decoder_fluid_progress_by_hand():
    # a = b = 1: two sequences step at 3 s per token; the 2-token one is done at 6 s,
    # then the other (2 tokens left) steps at 2 s per token: done at 10 s
    d = Decoder(1.0, 1.0)
    d.add(0, 2)
    d.add(1, 4)
    assert d.next_s() == pytest.approx(6.0)
    d.advance(6.0)
    assert d.pop_done() == [0]
    assert d.next_s() == pytest.approx(10.0)
    d.paused = True  # a weight sync from 6 s to 11 s: no progress, no finish; then 2 tokens at 2 s
    assert d.next_s() == float("inf")
    d.advance(11.0)
    d.paused = False
    assert d.next_s() == pytest.approx(15.0)
    d.advance(15.0)
    assert (
        d.pop_done() == [1] and d.tokens == pytest.approx(6.0) and d.busy_s == pytest.approx(10.0)
    )


def test_sync_matches_the_hand_computed_answer():
    w = _const()
    n, B, L = 5, 8, 100
    gen = L * (0.01 + 0.001 * B)  # 1.8 s: all 8 decode together for 100 steps
    learn = 0.2 + 1e-4 * B * (20 + L)  # 0.296 s
    T = n * (gen + learn) + (n - 1) * 0.5  # a sync pause after every update but the last
    r = simulate(w, Schedule("sync"), updates=n)
    assert r.sim_time_s == pytest.approx(T)
    assert r.trained_tokens_per_s == pytest.approx(n * B * L / T)
    assert r.learner_idle_frac == pytest.approx(1 - n * learn / T)
    assert r.generator_bubble_frac == pytest.approx(1 - n * gen / T)
    assert r.generator_mean_batch == pytest.approx(n * gen * B / T)
    assert (r.max_staleness, r.tokens_wasted, r.length_bias) == (0.0, 0, 1.0)


def test_one_step_ahead_matches_the_hand_computed_answer():
    # learner (0.296 s) faster than a batch (1.8 s): batch k >= 1 ends at (k+1)·g + (k−1)·s,
    # the last (k = n−1) is then trained: T = n·g + (n−2)·s + l; every batch but
    # the first is 1 stale
    w = _const()
    n, g, s, lrn = 5, 1.8, 0.5, 0.296
    r = simulate(w, Schedule("one_step"), updates=n)
    assert r.sim_time_s == pytest.approx(n * g + (n - 2) * s + lrn)
    assert r.max_staleness == 1.0 and r.staleness_mean == pytest.approx((n - 1) / n)


def test_overprovision_trains_the_first_complete_groups_and_counts_the_rest():
    r = simulate(TAIL, Schedule("overprovision", overprovision=0.5), updates=4)
    # 8 groups needed, 12 started per batch: 4 groups of 8 aborted per batch
    assert r.episodes_trained == 4 * 64 and r.episodes_aborted == 4 * 32
    assert r.tokens_wasted > 0 and r.length_bias < 1.0  # the long groups are the ones aborted


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "sched",
    [s for s in standard_schedules(eta=2, max_batch=16) if s.kind != "sync"],
    ids=lambda s: s.label,
)
def test_no_trained_token_is_older_than_the_bound(sched, seed):
    # fast learner, slow tools: the adversarial case for staleness (many versions per episode)
    w = dataclasses.replace(TAIL, learn_s_per_token=1e-5, tool_median_s=2.0)
    r = simulate(w, sched, updates=12, seed=seed)
    assert r.max_staleness <= sched.bound and r.staleness_p95 <= r.max_staleness
    assert r.episodes_trained > 0


def test_the_learner_drops_stale_groups_at_consumption_and_counts_them():
    w = dataclasses.replace(TAIL, learn_s_per_token=1e-5)
    r = simulate(w, Schedule("async", eta=1), updates=10)
    assert r.episodes_dropped > 0 and r.tokens_wasted > 0 and r.max_staleness <= 1
    assert r.episodes_dropped % w.group_size == 0  # whole groups (group-complete batches)


@pytest.mark.parametrize("max_concurrent", [24, 512])
def test_admission_follows_areals_capacity_rule(max_concurrent):
    # capacity = min(max_concurrent − running, (η + v + 1)·B − (accepted + running)) before
    # every group admitted (arXiv 2505.24298), with the slot limit binding (24) or not (512)
    from taurl.sim.simulator import Simulation

    seen = []

    class Checked(Simulation):
        def _start_group(self):
            cap = min(self.w.max_concurrent - self.running,
                      (self.s.eta + self._start_v() + 1) * self.B - (self.accepted + self.running))
            seen.append(cap)
            assert cap >= self.G
            return super()._start_group()

    w = dataclasses.replace(TAIL, max_concurrent=max_concurrent, learn_s_per_token=1e-4)
    r = Checked(w, Schedule("async", eta=2, interrupt=True), updates=8).run()
    assert len(seen) > r.updates and r.max_staleness <= 2


@pytest.mark.parametrize("interrupt", [False, True])
def test_a_row_cap_decodes_at_most_k_sequences_the_oldest_group_first(interrupt):
    from taurl.sim.simulator import Simulation

    w = dataclasses.replace(TAIL, learn_s_per_token=1e-4)
    started: list[int] = []  # group of every turn that began decoding while others waited

    class Watched(Simulation):
        def _decode(self, e):
            waiting = [g for g, eid in self.waiting if self.eps[eid].state == "waiting"]
            assert self.dec.n < 16 and (not waiting or e.group <= min(waiting)), (
                "a younger group went first"
            )
            super()._decode(e)
            started.append(e.group)

    capped = Watched(w, Schedule("async", eta=2, interrupt=interrupt, max_batch=16), updates=6)
    r = capped.run()
    assert capped.dec.peak == 16 and started  # the cap binds
    free = Simulation(w, Schedule("async", eta=2, interrupt=interrupt), updates=6)
    free.run()
    assert free.dec.peak > 16  # (without the cap this workload decodes more at once)
    assert r.max_staleness <= 2 and r.episodes_trained == 6 * w.batch_episodes


def test_sync_is_on_policy_and_async_beats_it_on_a_long_tail():
    scheds = [Schedule("async", eta=4), Schedule("async", eta=4, interrupt=True)]
    rows = {r.schedule: r for r in compare(TAIL, [Schedule("sync"), *scheds], updates=8)}
    assert rows["sync"].max_staleness == 0.0 and rows["sync"].length_bias == 1.0
    assert rows["sync"].speedup_vs_sync == 1.0
    assert rows["async(eta=4,interrupt)"].speedup_vs_sync > 1.5
    # interruption never waits for the tail to drain: more throughput than draining
    assert (
        rows["async(eta=4,interrupt)"].trained_tokens_per_s
        > rows["async(eta=4)"].trained_tokens_per_s
    )


def test_tokens_are_conserved():
    # every token the decoder emitted belongs to an episode; every token of a decided episode
    # (trained, masked, dropped, aborted) was trained or counted as wasted
    from taurl.sim.simulator import Simulation

    w = dataclasses.replace(TAIL, learn_s_per_token=1e-4)
    for sched in standard_schedules(eta=2, max_batch=16):
        sim = Simulation(w, sched, updates=6)
        r = sim.run()
        partial = sum(sim.eps[eid].plan.turn_tokens[sim.eps[eid].turn] - (f - sim.dec.progress)
                      for eid, f in sim.dec.finish.items())  # turns decoding at the end
        assert sim.dec.tokens == pytest.approx(
            sum(e.decoded for e in sim.eps.values()) + partial, rel=1e-9
        )
        decided = sum(
            e.decoded
            for e in sim.eps.values()
            if e.state in ("trained", "masked", "dropped", "aborted")
        )
        assert r.trained_tokens + r.tokens_wasted == pytest.approx(decided, abs=2), sched.label


def test_deterministic_for_a_seed():
    scheds = [
        Schedule("one_step"),
        Schedule("async", eta=2, interrupt=True),
        Schedule("overprovision", overprovision=0.5),
    ]
    a = [r.as_dict() for r in compare(TAIL, scheds, updates=4, seed=3)]
    b = [r.as_dict() for r in compare(TAIL, scheds, updates=4, seed=3)]
    c = [r.as_dict() for r in compare(TAIL, scheds, updates=4, seed=4)]
    assert a == b and a != c
    assert draw_episode(TAIL, 3, 7, 1) == draw_episode(TAIL, 3, 7, 1) != draw_episode(TAIL, 3, 7, 2)


def test_default_workload_has_the_published_long_tail():
    # issue 11's shape, "~5% of samples take ~80% of generation": read as time, the last 5%
    # of a synchronous batch's episodes take >= 60% of its generation phase (64% measured,
    # short of 80%: the generation budget caps the tail); read as tokens, the longest 5%
    # hold 30-60% of the generated tokens (46%)
    r = simulate(Workload(), Schedule("sync"), updates=30)
    assert r.tail_time_share >= 0.6
    assert 0.3 <= r.top5_token_share <= 0.6
    assert 0.5 <= r.learner_idle_frac <= 0.8  # rollout is 50-80% of a synchronous step


def test_tools_fail_and_time_out():
    w = dataclasses.replace(
        Workload(), tool_fail_prob=0.3, tool_median_s=2.0, tool_timeout_s=3.0, max_turns=6
    )
    plans = [draw_episode(w, 0, g, m) for g in range(20) for m in range(8)]
    outcomes = [o for p in plans for o in p.tool_outcome]
    assert {"ok", "failed", "timeout"} <= set(outcomes)
    assert max(t for p in plans for t in p.tool_s) == 3.0
    assert all(
        t == w.tool_fail_s
        for p in plans
        for t, o in zip(p.tool_s, p.tool_outcome, strict=True)
        if o == "failed"
    )


def test_bad_inputs_are_refused():
    with pytest.raises(ConfigError, match="Did you mean 'async'"):
        Schedule("asynch").check()
    with pytest.raises(ConfigError, match="eta must be 0"):
        simulate(Workload(), Schedule("sync", eta=2))
    with pytest.raises(ConfigError, match="interrupt applies to kind async only"):
        Schedule("one_step", interrupt=True).check()
    with pytest.raises(ConfigError, match="workload.decode_a_s"):
        Workload(decode_a_s=-1.0).check()
    with pytest.raises(Error, match="updates must be"):
        simulate(Workload(), Schedule("sync"), updates=0)
