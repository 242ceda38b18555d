"""A scale model on paper: one RL step's time on G GPUs from per-rank costs (issue 35 item 6).

Pure functions over typed records; `taurl.sim.placement` searches the placements with them
and `benchmarks/scale_model.py` prints the table. Every constant a prediction depends on is a
field of `Hardware`, `ModelShape` or `StepWorkload`, so docs/scale-out.md can put each
assumption next to what was measured. The costs, per step (one batch, one optimizer step):

* learner compute = F · N · T / (n · peak · MFU): N parameters, T trained tokens (prompt and
  generated tokens of every episode), n learner ranks, F = 6 FLOPs per parameter and token for
  a forward and backward (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", eq.
  2.1; attention's own FLOPs left out, under 10% at these sizes and ≤ 4k tokens);
* the collective: a ring moves 2(n−1)/n · B bytes per rank for an all-reduce of B bytes and
  (n−1)/n · B for an all-gather or a reduce-scatter (Patarasuk & Yuan 2009; NCCL's "bus
  bandwidth"), at the slowest link the ring crosses (NVLink within a node, the network
  across nodes). DDP all-reduces the gradients once per step (taurl accumulates micro-batches
  under `no_sync`); FSDP2 all-gathers the parameters in every micro-batch's forward and
  backward and reduce-scatters the gradients once (taurl's `set_requires_gradient_sync(False)`
  on all but the last micro-batch, which keeps unsharded gradients meanwhile: `memory`);
* generation: decoding is bound by reading the weights and the KV cache once per step
  (Pope et al. 2022, "Efficiently Scaling Transformer Inference", §2), or by its FLOPs
  2·N per token when the batch is large, and never under a fixed floor (kernel launches,
  sampling, the scheduler): step = max(bytes / (HBM bw · MBU), 2·N·b / (peak · decode MFU),
  floor), over the episode's generated tokens, in waves when the KV cache holds fewer
  sequences than the engine's share of the batch;
* weight sync: the policy's bytes in the engine dtype (2·N for bf16), learner to engines, at
  the bandwidth between them (the same GPU when colocated), plus a fixed reload cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TRAIN_FLOPS_PER_PARAM_TOKEN = 6.0  # forward 2 + backward 4 (Kaplan et al. 2020)
DECODE_FLOPS_PER_PARAM_TOKEN = 2.0  # forward only


@dataclass(frozen=True)
class ModelShape:
    """A decoder's size as the costs need it: parameters and what sizes activations and KV."""

    name: str
    params: float  # N, every parameter (embeddings included)
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token, bf16: 2 · layers · kv_heads · head_dim · 2 B."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2.0


@dataclass(frozen=True)
class Hardware:
    """One GPU kind and its cluster; every field is an assumption the docs state."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s of one GPU
    memory_bytes: float  # usable device memory of one GPU
    hbm_bytes_per_s: float  # device memory bandwidth
    intra_bytes_per_s: float  # collective bus bandwidth per GPU inside a node (NVLink)
    inter_bytes_per_s: float  # collective bus bandwidth per GPU across nodes (the network)
    gpus_per_node: int
    learner_mfu: float  # model FLOPs utilisation of the learner's forward and backward
    decode_mbu: float  # share of hbm_bytes_per_s a decode step reaches
    decode_mfu: float  # share of peak_flops a compute-bound decode step reaches
    decode_floor_s: float  # the least a decode step takes (launches, sampling, scheduling)
    collective_latency_s: float  # one small all-reduce's latency (a tensor-parallel layer's)
    reload_s: float  # fixed cost of an engine taking new weights (pause, load, cache reset)
    switch_s: float  # colocated only: engine wake and sleep around the learner's phase


@dataclass(frozen=True)
class StepWorkload:
    """One RL step: its episodes, their tokens, and the learner's settings."""

    episodes: int  # tasks × group size
    prompt_tokens: int  # per episode (system prompt, task, tool observations)
    generated_tokens: int  # per episode; a synchronous step waits for this many decode steps
    micro_batch_tokens: int  # per learner rank and micro-batch
    grad_bytes: float = 4.0  # fp32 gradients (bf16-mixed keeps fp32 master weights)
    param_gather_bytes: float = 4.0  # FSDP all-gathers fp32 parameters (autocast computes bf16)
    sync_bytes: float = 2.0  # the engine's dtype (bf16) per parameter
    activation_checkpointing: bool = True

    @property
    def trained_tokens(self) -> int:
        return self.episodes * (self.prompt_tokens + self.generated_tokens)


def ring_bytes(kind: str, n: int, payload: float) -> float:
    """Bytes each of `n` ranks sends for one ring collective of `payload` bytes.

    >>> ring_bytes("all_reduce", 4, 100.0), ring_bytes("all_gather", 4, 100.0)
    (150.0, 75.0)
    """
    if n <= 1:
        return 0.0
    factor = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}[kind]
    return factor * (n - 1) / n * payload


def link_bytes_per_s(hw: Hardware, ranks: int) -> float:
    """The ring's bottleneck: NVLink while every rank is in one node, the network beyond."""
    return hw.intra_bytes_per_s if ranks <= hw.gpus_per_node else hw.inter_bytes_per_s


def micro_batches(wl: StepWorkload, ranks: int) -> int:
    """Micro-batches each rank runs: its share of the trained tokens over micro_batch_tokens."""
    return max(1, math.ceil(wl.trained_tokens / ranks / wl.micro_batch_tokens))


def learner_compute_s(model: ModelShape, wl: StepWorkload, hw: Hardware, ranks: int) -> float:
    """F · N · T / (n · peak · MFU) seconds (module docstring)."""
    flops = TRAIN_FLOPS_PER_PARAM_TOKEN * model.params * wl.trained_tokens
    return flops / (ranks * hw.peak_flops * hw.learner_mfu)


def collective_bytes(strategy: str, model: ModelShape, wl: StepWorkload, ranks: int) -> float:
    """Bytes one learner rank sends per step for `strategy` (ddp | fsdp; module docstring).

    DDP: one all-reduce of the gradients. FSDP: an all-gather of the parameters in each
    micro-batch's forward and again in its backward, one reduce-scatter of the gradients.
    """
    if strategy == "ddp":
        return ring_bytes("all_reduce", ranks, model.params * wl.grad_bytes)
    if strategy == "fsdp":
        m = micro_batches(wl, ranks)
        gather = ring_bytes("all_gather", ranks, model.params * wl.param_gather_bytes)
        return 2 * m * gather + ring_bytes("reduce_scatter", ranks, model.params * wl.grad_bytes)
    raise ValueError(f"strategy {strategy!r}: ddp | fsdp")


def collective_s(strategy: str, model: ModelShape, wl: StepWorkload, hw: Hardware,
                 ranks: int) -> float:
    """The step's collective time, not overlapped with compute (an upper bound)."""
    return collective_bytes(strategy, model, wl, ranks) / link_bytes_per_s(hw, ranks)


def learner_memory(strategy: str, model: ModelShape, wl: StepWorkload, ranks: int) -> float:
    """Peak bytes on one learner rank: weights, gradients, AdamW, activations of a micro-batch.

    Per parameter: fp32 master weight 4 B, AdamW's two moments 8 B, the fp32 gradient 4 B
    (Rajbhandari et al. 2020, "ZeRO", §3: 16 B per parameter in mixed precision). DDP keeps all
    of it on every rank; FSDP shards weights and moments by n but, accumulating micro-batches
    without a reduce-scatter, holds whole unsharded gradients until the last one (taurl's
    `grad_sync`), plus one gathered layer. Activations per token: the layer inputs (2·h B in
    bf16 per layer) with checkpointing and one layer recomputed, ~34·h B per layer without
    (Korthikanti et al. 2022, "Reducing Activation Recomputation", §4.1, with fused attention),
    and the logits: vocab × 6 B (bf16 and their fp32 log-softmax).
    """
    n_per_layer = model.params / model.layers
    if strategy == "ddp":
        states = 16.0 * model.params
    elif strategy == "fsdp":
        grads = wl.grad_bytes * model.params if micro_batches(wl, ranks) > 1 else 0.0
        states = 12.0 * model.params / ranks + max(grads, wl.grad_bytes * model.params / ranks)
        states += wl.param_gather_bytes * n_per_layer
    else:
        raise ValueError(f"strategy {strategy!r}: ddp | fsdp")
    h, layers = model.hidden, model.layers
    per_token = (2.0 * h * layers + 34.0 * h) if wl.activation_checkpointing else 34.0 * h * layers
    per_token += 6.0 * model.vocab
    return states + per_token * wl.micro_batch_tokens


def learner_resident(strategy: str, model: ModelShape, ranks: int) -> float:
    """What a colocated learner rank keeps on the GPU while the engine generates: its fp32
    master weights and AdamW moments, 12 B per parameter, sharded by n under FSDP (gradients
    and activations are freed between steps)."""
    return 12.0 * model.params / (ranks if strategy == "fsdp" else 1)


def engine_memory_free(model: ModelShape, hw: Hardware, tp: int, reserved: float = 0.0) -> float:
    """KV-cache bytes one engine GPU has left: 90% of memory − its weight shard − `reserved`
    (the learner's state when colocated)."""
    return 0.9 * hw.memory_bytes - 2.0 * model.params / tp - reserved


def decode_step_s(model: ModelShape, hw: Hardware, tp: int, batch: int, context: float) -> float:
    """One decode step of `batch` sequences of mean `context` tokens on a tp-GPU engine, plus
    tensor parallelism's 2 all-reduces per layer of the batch's hidden states (bf16) when
    tp > 1 (Shoeybi et al. 2019, "Megatron-LM", §3), each at least collective_latency_s."""
    read = (2.0 * model.params + batch * context * model.kv_bytes_per_token) / tp
    memory_s = read / (hw.hbm_bytes_per_s * hw.decode_mbu)
    compute_s = (DECODE_FLOPS_PER_PARAM_TOKEN * model.params * batch
                 / (tp * hw.peak_flops * hw.decode_mfu))
    tp_s = 0.0
    if tp > 1:
        per = ring_bytes("all_reduce", tp, batch * model.hidden * 2.0) / hw.intra_bytes_per_s
        tp_s = 2 * model.layers * (hw.collective_latency_s + per)
    return max(memory_s, compute_s, hw.decode_floor_s) + tp_s


def generation_s(model: ModelShape, wl: StepWorkload, hw: Hardware, engines: int, tp: int,
                 reserved: float = 0.0) -> float:
    """Seconds for `engines` engines of tp GPUs to decode the step's episodes; inf when the
    weights leave no KV cache. Waves = ⌈share / resident sequences⌉; prefill is one forward
    of the prompts at the learner's MFU."""
    free = engine_memory_free(model, hw, tp, reserved)
    max_ctx = wl.prompt_tokens + wl.generated_tokens
    resident = int(free * tp // (max_ctx * model.kv_bytes_per_token)) if free > 0 else 0
    if resident < 1:
        return math.inf
    share = math.ceil(wl.episodes / engines)
    batch = min(share, resident)
    waves = math.ceil(share / batch)
    context = wl.prompt_tokens + wl.generated_tokens / 2
    decode = waves * wl.generated_tokens * decode_step_s(model, hw, tp, batch, context)
    prefill = (DECODE_FLOPS_PER_PARAM_TOKEN * model.params * share * wl.prompt_tokens
               / (tp * hw.peak_flops * hw.learner_mfu))
    return decode + prefill


def weight_sync_s(model: ModelShape, wl: StepWorkload, hw: Hardware, *, colocated: bool,
                  learner_ranks: int, cross_node: bool, strategy: str = "fsdp") -> float:
    """New weights into every engine, plus the engine's fixed reload cost. Colocated: an
    FSDP learner all-gathers the engine's copy across its ranks; a DDP rank holds it already
    (a copy on the device, not counted). Split: one pipelined broadcast of sync_bytes·N from
    the learner to the engines (its time independent of their count)."""
    payload = wl.sync_bytes * model.params
    if colocated:
        moved = ring_bytes("all_gather", learner_ranks, payload) if strategy == "fsdp" else 0.0
        return moved / link_bytes_per_s(hw, learner_ranks) + hw.reload_s
    bw = hw.inter_bytes_per_s if cross_node else hw.intra_bytes_per_s
    return payload / bw + hw.reload_s


def achieved_flops(params: float, tokens: float, seconds: float) -> float:
    """Calibration from a measured learner step: 6 · N · tokens / seconds FLOP/s.

    >>> achieved_flops(1e9, 1000, 2.0)
    3000000000000.0
    """
    return TRAIN_FLOPS_PER_PARAM_TOKEN * params * tokens / seconds


__all__ = ["Hardware", "ModelShape", "StepWorkload", "achieved_flops", "collective_bytes",
           "collective_s", "decode_step_s", "engine_memory_free", "generation_s",
           "learner_compute_s", "learner_memory", "learner_resident", "link_bytes_per_s",
           "micro_batches",
           "ring_bytes", "weight_sync_s"]
