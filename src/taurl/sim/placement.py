"""The best placement of learner ranks and engines on G GPUs, by the costs of `taurl.sim.scale`.

Three ways to use G GPUs for one RL step, each with DDP or FSDP learners and engines of
tp ∈ {1, 2, 4, 8} GPUs (tensor parallel, within one node):

* ``colocated``: every GPU is a learner rank and part of an engine, in turn (the engine
  sleeps while the learner steps; the learner's state stays on the GPU and takes KV-cache
  room): step = generation + learner + weight sync + switch;
* ``split``: L GPUs learn, G − L serve engines, synchronously: step = generation + learner +
  weight sync (one side idles while the other works);
* ``split-async``: the same GPUs, the engines one version ahead (taurl's `schedule: async`
  at η = 1): step = max(generation, learner) + weight sync.

A placement is feasible when the learner's peak memory fits a GPU (`learner_memory`) and the
engine has room for at least one sequence's KV cache. `best` picks the smallest step time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from taurl.sim.scale import (
    Hardware,
    ModelShape,
    StepWorkload,
    collective_s,
    generation_s,
    learner_compute_s,
    learner_memory,
    learner_resident,
    weight_sync_s,
)

KINDS = ("colocated", "split", "split-async")
TP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Placement:
    """One way to run the step, with its predicted parts (seconds) and the total."""

    kind: str
    strategy: str  # the learner's: ddp | fsdp
    learner_gpus: int
    engine_gpus: int
    tp: int
    generation_s: float
    learner_s: float  # compute + collective
    collective_s: float
    sync_s: float
    step_s: float

    @property
    def engines(self) -> int:
        return self.engine_gpus // self.tp

    @property
    def engines_per_learner_rank(self) -> float:
        return self.engines / self.learner_gpus

    def label(self) -> str:
        """e.g. ``split-async fsdp L=2 E=6×tp1 (3.0/rank)``."""
        return (f"{self.kind} {self.strategy} L={self.learner_gpus} "
                f"E={self.engines}×tp{self.tp} ({self.engines_per_learner_rank:.2g}/rank)")


def learner_s(strategy: str, model: ModelShape, wl: StepWorkload, hw: Hardware,
              ranks: int) -> tuple[float, float]:
    """(learner seconds, of which collective) on `ranks` GPUs; inf when it does not fit."""
    if learner_memory(strategy, model, wl, ranks) > 0.9 * hw.memory_bytes:
        return math.inf, math.inf
    comm = collective_s(strategy, model, wl, hw, ranks)
    return learner_compute_s(model, wl, hw, ranks) + comm, comm


def colocated(strategy: str, model: ModelShape, wl: StepWorkload, hw: Hardware, gpus: int,
              tp: int) -> Placement:
    """Every GPU a learner rank and a tp-th of an engine; the learner's state takes KV room."""
    learn, comm = learner_s(strategy, model, wl, hw, gpus)
    reserved = learner_resident(strategy, model, gpus)
    gen = generation_s(model, wl, hw, gpus // tp, tp, reserved=reserved)
    sync = weight_sync_s(model, wl, hw, colocated=True, learner_ranks=gpus, cross_node=False,
                         strategy=strategy)
    step = gen + learn + sync + hw.switch_s
    return Placement("colocated", strategy, gpus, gpus, tp, gen, learn, comm, sync, step)


def split(strategy: str, model: ModelShape, wl: StepWorkload, hw: Hardware, learner_gpus: int,
          engine_gpus: int, tp: int, overlap: bool) -> Placement:
    """L learner GPUs and engine_gpus engine GPUs; `overlap`: the async step (max, not sum).
    The sync crosses the network when the learner and engines cannot share one node."""
    learn, comm = learner_s(strategy, model, wl, hw, learner_gpus)
    gen = generation_s(model, wl, hw, engine_gpus // tp, tp)
    cross = learner_gpus + engine_gpus > hw.gpus_per_node
    sync = weight_sync_s(model, wl, hw, colocated=False, learner_ranks=learner_gpus,
                         cross_node=cross)
    step = (max(gen, learn) if overlap else gen + learn) + sync
    kind = "split-async" if overlap else "split"
    return Placement(kind, strategy, learner_gpus, engine_gpus, tp, gen, learn, comm, sync, step)


def candidates(model: ModelShape, wl: StepWorkload, hw: Hardware, gpus: int) -> Iterator[Placement]:
    """Every placement of the three kinds on `gpus` GPUs; tp divides the learner's and the
    engines' GPUs, so no engine straddles two nodes."""
    for strategy in ("ddp", "fsdp"):
        for tp in TP_CHOICES:
            if tp > min(gpus, hw.gpus_per_node):
                continue
            if gpus % tp == 0:
                yield colocated(strategy, model, wl, hw, gpus, tp)
            for learner_gpus in range(1, gpus):
                engine_gpus = gpus - learner_gpus
                if engine_gpus % tp or learner_gpus % tp:  # engines inside nodes
                    continue
                for overlap in (False, True):
                    yield split(strategy, model, wl, hw, learner_gpus, engine_gpus, tp, overlap)


def best(model: ModelShape, wl: StepWorkload, hw: Hardware, gpus: int,
         kind: str | None = None) -> Placement | None:
    """The fastest feasible placement (of `kind` only, if given); None when nothing fits."""
    pool = [p for p in candidates(model, wl, hw, gpus)
            if (kind is None or p.kind == kind) and math.isfinite(p.step_s)]
    return min(pool, key=lambda p: (p.step_s, p.learner_gpus)) if pool else None


__all__ = ["KINDS", "Placement", "best", "candidates", "colocated", "learner_s", "split"]
