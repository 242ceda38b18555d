"""The distributed learner against `Learner`: the same batches through both, side by side.

The check behind "N ranks take the step one rank takes" (tests/train/test_distributed_learner.py
on the tiny policy, benchmarks/dist_equivalence.py on a real one): from the same weights and
the same seed, run the single-process learner and the ranked one over the same batches, then
compare each update's metrics (relative difference |got - expect| / |expect|) and the final
weights (largest absolute difference, read beside the lr: one AdamW step moves a weight by
about lr, so a difference far below lr is rounding, not a different step).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from taurl.data.trajectory import Trajectory
from taurl.train.distributed.driver import DistributedLearner
from taurl.train.distributed.pool import RankPool
from taurl.train.learner import Learner, LearnerConfig

# the metrics that must agree to 1e-5 relative on every update that took a step
STEP_KEYS = ("learn/loss", "learn/grad_norm")


def relative_difference(expect: float, got: float) -> float:
    """|got - expect| / |expect| (0 when both are 0)."""
    if expect == got:
        return 0.0
    return abs(got - expect) / abs(expect) if expect else float("inf")


def max_weight_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """max_i |a_i - b_i| over every parameter of two models of one architecture."""
    return max(float((p - q).detach().abs().max())
               for p, q in zip(a.parameters(), b.parameters(), strict=True))


@dataclass
class Pair:
    """Both learners after the same updates: their per-update metrics, models and seconds."""

    one: Learner
    two: DistributedLearner
    expect: list[dict[str, float]]
    got: list[dict[str, float]]
    one_s: list[float] = field(default_factory=list)  # wall seconds of each update, one process
    two_s: list[float] = field(default_factory=list)  # ... and on the ranks (driver included)

    def relative(self, keys: Sequence[str] = STEP_KEYS, updates: int | None = None
                 ) -> dict[str, float]:
        """The largest relative difference of each metric over the first `updates` updates."""
        n = len(self.expect) if updates is None else updates
        return {k: max(relative_difference(e[k], g[k])
                       for e, g in zip(self.expect[:n], self.got[:n], strict=True)) for k in keys}

    def weight_difference(self) -> float:
        return max_weight_difference(self.one.model, self.two.model)


def run_pair(model: torch.nn.Module, config: LearnerConfig, batches: Sequence[Sequence[Trajectory]],
             *, strategy: str, world_size: int, reference: torch.nn.Module | None = None,
             pool: RankPool | None = None, pad_id: int = 0, device: str = "cpu",
             lean: bool = False) -> Pair:
    """`Learner` and `DistributedLearner` from copies of `model` (and of `reference`), each
    updated on every batch in order; `model` itself is not changed. lean: drop the single
    learner's AdamW state and gradients before the ranks start (its weights stay for the
    comparison) and give `model` itself to the ranked learner (it is changed): a 135M model
    in fp64 holds 2.2 GB of AdamW state and 1.1 GB of weights."""
    single = Learner(copy.deepcopy(model), config, pad_id=pad_id,
                     reference=copy.deepcopy(reference) if reference is not None else None)
    expect, one_s = [], []
    for batch in batches:
        t = time.perf_counter()
        expect.append(single.update(batch))
        one_s.append(time.perf_counter() - t)
    if lean:
        single.optimizer.state.clear()
        single.model.zero_grad(set_to_none=True)
    ranked = DistributedLearner(model if lean else copy.deepcopy(model), config, strategy=strategy,
                                world_size=world_size, pad_id=pad_id, reference=reference,
                                device=device, pool=pool)
    got, two_s = [], []
    for batch in batches:
        t = time.perf_counter()
        got.append(ranked.update(batch))
        two_s.append(time.perf_counter() - t)
    return Pair(single, ranked, expect, got, one_s, two_s)
