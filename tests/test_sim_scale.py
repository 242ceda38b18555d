"""The scale model's pure functions (taurl.sim.scale, taurl.sim.placement) on cases worked by
hand: each expected number is written out from the formula in the function's docstring."""

from __future__ import annotations

import dataclasses
import math

import pytest

from taurl.sim.placement import best, candidates, colocated, split
from taurl.sim.presets import DEFAULT_STEP, H100, MEASURED_H200_MFU, MODELS
from taurl.sim.scale import (
    Hardware,
    ModelShape,
    StepWorkload,
    achieved_flops,
    collective_bytes,
    collective_s,
    decode_step_s,
    generation_s,
    learner_compute_s,
    learner_memory,
    learner_resident,
    micro_batches,
    ring_bytes,
    weight_sync_s,
)

# round numbers so the hand computations stay short
HW = Hardware(name="toy", peak_flops=1e12, memory_bytes=100e9, hbm_bytes_per_s=1e12,
              intra_bytes_per_s=100e9, inter_bytes_per_s=10e9, gpus_per_node=8,
              learner_mfu=0.5, decode_mbu=0.5, decode_mfu=0.5, decode_floor_s=1e-3,
              collective_latency_s=0.0, reload_s=1.0, switch_s=2.0)
M = ModelShape("toy-1B", params=1e9, layers=2, hidden=10, kv_heads=1, head_dim=5, vocab=100)
WL = StepWorkload(episodes=10, prompt_tokens=50, generated_tokens=50, micro_batch_tokens=100)


def test_ring_collective_bytes():
    assert ring_bytes("all_reduce", 4, 100.0) == 150.0  # 2 · 3/4 · 100
    assert ring_bytes("all_gather", 4, 100.0) == 75.0  # 3/4 · 100
    assert ring_bytes("reduce_scatter", 2, 100.0) == 50.0
    assert ring_bytes("all_reduce", 1, 100.0) == 0.0  # one rank sends nothing


def test_learner_compute_is_6NT_over_ranks_peak_mfu():
    assert WL.trained_tokens == 1000  # 10 · (50 + 50)
    # 6 · 1e9 · 1000 / (2 · 1e12 · 0.5) = 6 s
    assert learner_compute_s(M, WL, HW, 2) == pytest.approx(6.0)


def test_collective_bytes_ddp_and_fsdp():
    # DDP: one all-reduce of 4 B gradients: 2 · 3/4 · 4e9
    assert collective_bytes("ddp", M, WL, 4) == pytest.approx(6e9)
    # FSDP, 4 ranks: 1000 / 4 / 100 → 3 micro-batches; 2 · 3 all-gathers of 4 B parameters
    # (3/4 · 4e9 each) and one reduce-scatter (3/4 · 4e9): 18e9 + 3e9
    assert micro_batches(WL, 4) == 3
    assert collective_bytes("fsdp", M, WL, 4) == pytest.approx(21e9)
    with pytest.raises(ValueError):
        collective_bytes("zero3", M, WL, 4)


def test_collective_time_uses_the_network_once_the_ranks_leave_a_node():
    # 8 ranks: 2 · 7/8 · 4e9 = 7e9 B at 100 GB/s; 16 ranks: 2 · 15/16 · 4e9 = 7.5e9 at 10 GB/s
    assert collective_s("ddp", M, WL, HW, 8) == pytest.approx(0.07)
    assert collective_s("ddp", M, WL, HW, 16) == pytest.approx(0.75)


def test_learner_memory():
    # per token with checkpointing: 2·h·layers + 34·h + 6·vocab = 40 + 340 + 600 = 980 B,
    # times 100 tokens per micro-batch = 98,000 B
    act = 98_000.0
    assert learner_memory("ddp", M, WL, 4) == pytest.approx(16e9 + act)
    # FSDP on 4 ranks, 3 micro-batches: 12 B/4 sharded + 4 B whole gradients + one gathered
    # layer (4 B · 1e9 / 2 layers): 3e9 + 4e9 + 2e9
    assert learner_memory("fsdp", M, WL, 4) == pytest.approx(9e9 + act)
    # 10 ranks: one micro-batch (1000 / 10 / 100), so the gradient is sharded too: 1.2e9 + 0.4e9
    assert learner_memory("fsdp", M, WL, 10) == pytest.approx(1.6e9 + 2e9 + act)
    no_ckpt = dataclasses.replace(WL, activation_checkpointing=False)
    # 34 · h · layers + 6 · vocab = 680 + 600 = 1,280 B per token
    assert learner_memory("ddp", M, no_ckpt, 4) == pytest.approx(16e9 + 128_000)
    assert learner_resident("fsdp", M, 4) == 3e9 and learner_resident("ddp", M, 4) == 12e9


def test_decode_step_memory_compute_and_floor():
    # memory-bound: (2e9 + 1 · 0 · kv) / (1e12 · 0.5) = 4 ms
    assert decode_step_s(M, HW, 1, 1, 0.0) == pytest.approx(4e-3)
    # compute-bound: 2 · 1e9 · 1000 / (1e12 · 0.5) = 4 s > memory (2e9 + 1000 · 10 · 40) / 5e11
    assert M.kv_bytes_per_token == 40.0  # K and V · 2 layers · 1 head · 5 · 2 B
    assert decode_step_s(M, HW, 1, 1000, 10.0) == pytest.approx(4.0)
    tiny = dataclasses.replace(M, params=1e6)  # 2e6 / 5e11 = 4 µs: the 1 ms floor
    assert decode_step_s(tiny, HW, 1, 1, 0.0) == pytest.approx(1e-3)
    # tp 2: memory halves (2 ms) plus 2 · layers all-reduces of 1 · h · 2 B (2 · 1/2 · 20 B)
    tp2 = 2e-3 + 4 * (20.0 / 100e9)
    assert decode_step_s(M, HW, 2, 1, 0.0) == pytest.approx(tp2)


def test_generation_waves_when_the_kv_cache_is_short():
    # 2 engines share 10 episodes: 5 each, all resident; 50 steps of the 5-sequence step at
    # context 50 + 25 = 75, then the prefill 2 · 1e9 · 5 · 50 / (1e12 · 0.5)
    step = decode_step_s(M, HW, 1, 5, 75.0)
    assert generation_s(M, WL, HW, 2, 1) == pytest.approx(50 * step + 1.0)
    # room for 2 sequences of 100 tokens (40 B each per token): 8,000 B of KV cache left
    reserved = 0.9 * 100e9 - 2e9 - 8000.0
    waves = math.ceil(5 / 2)
    expected = waves * 50 * decode_step_s(M, HW, 1, 2, 75.0) + 1.0
    assert generation_s(M, WL, HW, 2, 1, reserved=reserved) == pytest.approx(expected)
    assert generation_s(M, WL, HW, 2, 1, reserved=0.9 * 100e9) == math.inf  # no room at all


def test_weight_sync():
    # split across nodes: 2 B · 1e9 at 10 GB/s + 1 s reload; inside a node at 100 GB/s
    assert weight_sync_s(M, WL, HW, colocated=False, learner_ranks=4,
                         cross_node=True) == pytest.approx(1.2)
    assert weight_sync_s(M, WL, HW, colocated=False, learner_ranks=4,
                         cross_node=False) == pytest.approx(1.02)
    # colocated, 4 FSDP ranks all-gather the bf16 copy: 3/4 · 2e9 at 100 GB/s, + reload
    assert weight_sync_s(M, WL, HW, colocated=True, learner_ranks=4,
                         cross_node=False) == pytest.approx(1.015)
    # colocated DDP: every rank holds the whole weights, so only the reload is left
    assert weight_sync_s(M, WL, HW, colocated=True, learner_ranks=4, cross_node=False,
                         strategy="ddp") == pytest.approx(1.0)


def test_placements_add_their_parts():
    p = split("ddp", M, WL, HW, 4, 4, 1, overlap=False)
    assert p.step_s == pytest.approx(p.generation_s + p.learner_s + p.sync_s)
    q = split("ddp", M, WL, HW, 4, 4, 1, overlap=True)
    assert q.step_s == pytest.approx(max(q.generation_s, q.learner_s) + q.sync_s)
    assert q.engines_per_learner_rank == 1.0 and "L=4 E=4×tp1" in q.label()
    c = colocated("fsdp", M, WL, HW, 8, 2)
    assert c.step_s == pytest.approx(c.generation_s + c.learner_s + c.sync_s + HW.switch_s)
    assert c.engines == 4


def test_best_is_the_fastest_feasible_and_none_when_nothing_fits():
    every = [p for p in candidates(M, WL, HW, 8) if math.isfinite(p.step_s)]
    top = best(M, WL, HW, 8)
    assert top is not None and top.step_s == min(p.step_s for p in every)
    # no engine straddles a node: tp divides the learner's and the engines' GPUs
    assert all(p.learner_gpus % p.tp == 0 and p.engine_gpus % p.tp == 0
               for p in candidates(M, WL, HW, 16) if p.kind != "colocated")
    # a 1e9-parameter model on 5 GB GPUs: the DDP learner (16 GB) never fits, nor FSDP on 1 GPU
    small = dataclasses.replace(HW, memory_bytes=5e9)
    assert best(M, WL, small, 1) is None
    assert all(p.strategy == "fsdp" for p in candidates(M, WL, small, 8)
               if math.isfinite(p.step_s))


def test_calibration_and_presets():
    assert achieved_flops(1e9, 1000, 2.0) == 3e12
    # 6 · 134,515,008 · 89,400 / 989e12 ≈ 0.073 (the H200 figure of BENCHMARKS.md)
    assert pytest.approx(0.07295, rel=1e-3) == MEASURED_H200_MFU
    assert DEFAULT_STEP.trained_tokens == 512 * 2048
    # an 8B DDP learner does not fit an 80 GB GPU; FSDP on 8 does
    assert learner_memory("ddp", MODELS["8B"], DEFAULT_STEP, 8) > H100.memory_bytes
    assert learner_memory("fsdp", MODELS["8B"], DEFAULT_STEP, 8) < 0.9 * H100.memory_bytes
