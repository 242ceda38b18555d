"""taurl.sim.calibrate: each fit recovers known parameters from synthetic data."""

import math
import random

import numpy as np
import pytest

from taurl.errors import Error
from taurl.recipe.schedule.latency import ToolLatency
from taurl.sim import Workload, draw_episode
from taurl.sim.calibrate import (
    DecodeProbe,
    SyncObservations,
    calibrate,
    fit_line,
    fit_lognormal,
    fit_turns,
    sim_tool_latency,
)


def test_fit_lognormal_recovers_median_and_sigma():
    rng = np.random.default_rng(0)
    x = np.exp(math.log(300) + 1.2 * rng.standard_normal(20000))
    median, sigma = fit_lognormal(x)
    assert median == pytest.approx(300, rel=0.03)
    assert sigma == pytest.approx(1.2, rel=0.02)
    with pytest.raises(Error):
        fit_lognormal([1.0, 0.0])


def test_fit_line_recovers_a_and_b_and_keeps_them_non_negative():
    rng = np.random.default_rng(1)
    x = rng.uniform(1, 64, 200)
    a, b = fit_line(x, 0.01 + 0.002 * x + rng.normal(0, 1e-4, 200))
    assert a == pytest.approx(0.01, abs=2e-4) and b == pytest.approx(0.002, rel=0.01)
    # a negative intercept is noise: the line goes through the origin (slope Σxy/Σx² = 2 here)
    assert fit_line([1, 2, 3], [1.5, 4, 6.5]) == (0.0, pytest.approx(2.0, rel=0.05))
    # a falling line: the mean, no slope
    assert fit_line([1, 2, 3], [3, 2, 1]) == (2.0, 0.0)
    # one distinct x: through the origin
    assert fit_line([4, 4], [2, 2]) == (0.0, 0.5)


def test_sim_tool_latency_matches_the_real_wrappers_draws():
    lat = ToolLatency(env=None, mean_s=1.0, sigma=1.0, max_s=5.0)
    lat._rng = random.Random(0)
    draws = np.array([lat.delay() for _ in range(20000)])
    median, sigma, timeout = sim_tool_latency(1.0, 1.0, 5.0)
    assert np.median(draws) == pytest.approx(median, rel=0.03)  # 0.607 s, not the mean of 1 s
    assert timeout == 5.0 and draws.max() <= 5.0
    # below the cap the log-draws have the same σ
    # truncation shrinks it a little
    assert np.log(draws[draws < 5.0]).std() == pytest.approx(sigma, rel=0.08)


@pytest.mark.parametrize("max_turns,p", [(2, 0.5), (3, 0.6), (4, 0.0)])
def test_fit_turns_recovers_the_turn_model(max_turns, p):
    # the simulator's model (taurl.sim.workload): T = 1 with probability p, else
    # Uniform{1..M}; T − 1 calls
    rng = np.random.default_rng(3)
    n = 100_000
    turns = np.where(rng.random(n) < p, 1, rng.integers(1, max_turns + 1, n))
    m, q = fit_turns(list(turns - 1))
    assert m == max_turns
    assert q == pytest.approx(p, abs=0.01)  # std of the estimate ≈ 0.003


def test_the_simulators_episodes_follow_that_turn_model():
    w = Workload(max_turns=3, single_turn_prob=0.6, gen_median_tokens=40, gen_sigma=0.3)
    calls = np.array([len(draw_episode(w, 0, g, m).tool_s) for g in range(500) for m in range(8)])
    # P(no call) = p + (1 − p)/M = 0.733; P(2 calls) = (1 − p)/M = 0.133 (std of each share ≈ 0.007)
    assert (calls == 0).mean() == pytest.approx(0.6 + 0.4 / 3, abs=0.03)
    assert (calls == 2).mean() == pytest.approx(0.4 / 3, abs=0.03)
    assert fit_turns(list(calls))[0] == 3


def test_fit_turns_edge_cases():
    assert fit_turns([0, 0, 0]) == (1, 0.0)
    assert fit_turns([0, 0, 0, 1]) == (2, 0.5)
    # every episode calls once: share 1 > 1/2, p clipped at 0
    assert fit_turns([1, 1, 1, 1]) == (2, 0.0)
    with pytest.raises(Error):
        fit_turns([])


def test_calibrate_recovers_a_known_workload():
    truth = Workload(
        tasks_per_batch=8, group_size=8, gen_median_tokens=30, gen_sigma=0.5, max_gen_tokens=4096,
        max_turns=2, single_turn_prob=0.4, prompt_tokens=27, obs_tokens=60,
    )
    plans = [draw_episode(truth, 0, g, m) for g in range(400) for m in range(8)]
    rng = np.random.default_rng(2)
    batch_tokens = [
        float(sum(p.total_tokens for p in plans[i * 64 : (i + 1) * 64])) for i in range(6)
    ]
    obs = SyncObservations(
        action_tokens=tuple(p.gen_tokens for p in plans),
        tool_calls=tuple(len(p.tool_s) for p in plans),
        prompt_tokens=27.0,
        obs_tokens=60.0,
        learn_s=tuple(0.8 + 4e-4 * t for t in batch_tokens),
        learn_tokens=tuple(batch_tokens),
        sync_s=(0.05, 0.07),
        tasks_per_batch=8,
        group_size=8,
        max_episode_tokens=4096,
        latency_mean_s=1.0,
        latency_sigma=1.0,
        latency_max_s=5.0,
    )
    ns = np.array([1.0, 8, 32, 64])
    probe = DecodeProbe(tuple(ns), tuple(0.004 + 0.0005 * ns + rng.normal(0, 1e-5, 4)), 2e-5)
    cal = calibrate(obs, probe, max_concurrent=336)
    w = cal.workload
    assert w.gen_median_tokens == pytest.approx(30, rel=0.05) and w.gen_sigma == pytest.approx(
        0.5, rel=0.05
    )
    assert (w.max_turns, w.single_turn_prob) == (2, pytest.approx(0.4, abs=0.03))
    assert cal.sim_tool_call_share == pytest.approx(cal.tool_call_share, abs=1e-9) and not cal.notes
    assert (
        w.tool_median_s == pytest.approx(math.exp(-0.5))
        and w.tool_fail_prob == 0
        and w.tool_timeout_s == 5.0
    )
    assert w.decode_a_s == pytest.approx(0.004, abs=1e-4) and w.decode_b_s == pytest.approx(
        0.0005, rel=0.02
    )
    assert w.learn_fixed_s == pytest.approx(0.8, rel=1e-6) and w.learn_s_per_token == pytest.approx(
        4e-4, rel=1e-6
    )
    assert (
        w.sync_s == pytest.approx(0.06)
        and w.max_concurrent == 336
        and w.reprefill_s_per_token == 2e-5
    )
