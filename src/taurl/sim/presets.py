"""The scale model's named inputs: model shapes (from their published configs), the GPU
assumptions, the default RL step. docs/scale-out.md lists each beside what was measured.

Assumed, not measured here (no GPU cluster was lent): the H100's dense bf16 peak (NVIDIA's
data sheet, SXM), 80 GB, 3.35 TB/s HBM3; NVLink 4's 450 GB/s per direction per GPU with 80%
reached by a ring collective; 8 × 400 Gb/s InfiniBand per 8-GPU node (50 GB/s per GPU) at
80%; MFU, MBU and the engine's reload and wake/sleep costs as in `H100`. Measured: the
learner's MFU at SmolLM2-135M's shape on one H200 (`MEASURED_H200_MFU`).
"""

from __future__ import annotations

from taurl.sim.scale import Hardware, ModelShape, StepWorkload

# (name, params, layers, hidden, kv_heads, head_dim, vocab) from each model's config.json
MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("0.5B", 494_032_768, 24, 896, 2, 64, 151_936),  # Qwen2.5-0.5B (tied)
    ModelShape("1.5B", 1_543_714_304, 28, 1536, 2, 128, 151_936),  # Qwen2.5-1.5B
    ModelShape("3B", 3_085_938_688, 36, 2048, 2, 128, 151_936),  # Qwen2.5-3B
    ModelShape("7B", 7_615_616_512, 28, 3584, 4, 128, 152_064),  # Qwen2.5-7B
    ModelShape("8B", 8_030_261_248, 32, 4096, 8, 128, 128_256),  # Llama-3.1-8B
)}
SMOLLM2_135M = ModelShape("135M", 134_515_008, 30, 576, 3, 64, 49_152)

# One H200 (989 TFLOP/s dense bf16), SmolLM2-135M's shape with random weights, bf16, 64 × 512
# tokens: 89.4k trained tokens/s = 72 TFLOP/s as 6N per token (BENCHMARKS.md, 2026-12-04)
MEASURED_H200_MFU = 6 * SMOLLM2_135M.params * 89_400 / 989e12

H100 = Hardware(
    name="H100 SXM",
    peak_flops=989e12,
    memory_bytes=80e9,
    hbm_bytes_per_s=3.35e12,
    intra_bytes_per_s=0.8 * 450e9,
    inter_bytes_per_s=0.8 * 50e9,
    gpus_per_node=8,
    learner_mfu=0.35,  # assumed for 0.5B-8B with sdpa and bf16; measured 0.073 at 135M (eager)
    decode_mbu=0.6,  # assumed: a decode step reads the weights and KV at 60% of HBM bandwidth
    decode_mfu=0.4,  # assumed: a compute-bound (large-batch) decode step
    decode_floor_s=0.008,  # assumed: 8 ms per decode step at least (CUDA graphs, sampling)
    collective_latency_s=10e-6,  # assumed: a small NVLink all-reduce
    reload_s=0.5,  # assumed: an engine pausing, loading new weights and resetting its cache
    switch_s=2.0,  # assumed: colocated engine wake + sleep per step
)

# 64 tasks × 8 rollouts; an agentic episode's context (prompt and tool observations) and its
# generated tokens; 16k tokens per learner micro-batch
DEFAULT_STEP = StepWorkload(episodes=512, prompt_tokens=1024, generated_tokens=1024,
                            micro_batch_tokens=16_384)

__all__ = ["DEFAULT_STEP", "H100", "MEASURED_H200_MFU", "MODELS", "SMOLLM2_135M"]
