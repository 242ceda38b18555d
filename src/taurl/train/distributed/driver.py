"""The distributed learner as the recipe sees it: a `Learner` whose updates run on N ranks.

    learner = DistributedLearner(model, config, strategy="fsdp", world_size=2, pad_id=...)
    credit  = credit_step(learner, batch)    # here, as the single learner (numpy only)
    stats   = learner.update(batch, credit=credit)   # every rank trains its share; rank 0's
                                             # metrics; `model` now holds the new weights
    learner.close()

The driver process holds no rank. It starts the ranks (`taurl.train.distributed.pool`),
sends each the model, the reference and the config (`worker.Rank.build`), and per update
the batch and its credited rows (`taurl.train.credit_step`); after a step rank 0 gathers
the whole weights and they are loaded into the driver's `model`, so the recipe checkpoints
and serves that plain HF model as today (`save_checkpoint` writes the same directory).
`optimizer` stands for the ranks' AdamW: its ``state_dict()`` is the whole state gathered on
rank 0, in the single-process format, and ``load_state_dict`` sends one to every rank, so
resume works as with one process.

What runs only with one process (refused by the config: `taurl.recipe.config`): a critic
(gae), a step scorer, LoRA, the async schedule and the dpo / distill / rejection stages.
SFT on the ranks is `taurl.train.distributed.sft.ranked_sft_loop`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from taurl.credit import needs_values
from taurl.data.trajectory import Trajectory
from taurl.errors import ConfigError
from taurl.train.credit_step import Credited, credit_step
from taurl.train.distributed.launch import launch_ranks
from taurl.train.distributed.pool import RankPool
from taurl.train.distributed.wire import to_bytes
from taurl.train.learner import Learner, LearnerConfig


class RanksOptimizer:
    """The ranks' AdamW as the recipe uses an optimizer: the state dict (whole, rank 0's
    gather), loading one, and step pre-hooks (called before each update's step)."""

    def __init__(self, pool: RankPool):
        self.pool = pool
        self.hooks: list[Callable[..., None]] = []
        self.param_groups: list[dict[str, Any]] = []  # the driver has none of the trained tensors
        self.state: dict[Any, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return self.pool.call("optimizer_state")[0]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.call("load_optimizer_state", state)

    def register_step_pre_hook(self, hook: Callable[..., None]) -> None:
        self.hooks.append(hook)


class DistributedLearner(Learner):
    """`Learner` whose updates run on `world_size` ranks with `strategy` (ddp | fsdp)."""

    runs_forward = False  # the ranks checkpoint activations on their copies; this one is sent

    def __init__(self, model: torch.nn.Module, config: LearnerConfig, *, strategy: str,
                 world_size: int, pad_id: int = 0, reference: torch.nn.Module | None = None,
                 device: str = "cpu", pool: RankPool | None = None,
                 launch: dict[str, Any] | None = None):
        """pool: ranks already started (kept open by `close`); None starts `world_size` ranks
        with `launch` (`launch.launch_ranks`: local processes, or yours with
        TAURL_DIST_LAUNCH=external; Ray actors with ``{"launcher": "ray"}``)."""
        if needs_values(config.estimator):  # the critic would train in the driver, not the ranks
            raise ConfigError(f"estimator {config.estimator!r} needs a critic, which runs with "
                              "train.strategy single only")
        super().__init__(model, config, pad_id=pad_id, reference=reference)
        self.owns_pool = pool is None
        self.pool = pool if pool is not None else launch_ranks(world_size, device, **(launch or {}))
        if self.pool.world_size != world_size:
            raise ValueError(f"the pool has {self.pool.world_size} ranks, not {world_size}")
        self.pool.call("build", to_bytes(model), to_bytes(self.reference), config, pad_id, strategy)
        self.optimizer = RanksOptimizer(self.pool)  # type: ignore[assignment]

    def update(self, trajs: Sequence[Trajectory], version: int | None = None,
               credit: Credited | None = None) -> dict[str, float]:
        """`Learner.update` on the ranks; the driver's model then holds the new weights."""
        for wait in self.before_step:
            wait()
        for hook in self.optimizer.hooks:
            hook(self.optimizer, (), {})
        credit = credit_step(self, trajs) if credit is None else credit
        stats = self.pool.call("update", list(trajs), version, credit)[0]
        if not stats.get("learn/skipped"):
            self.pull_weights()
        return stats

    def pull_weights(self) -> None:
        """Load the ranks' weights (gathered on rank 0) into the driver's model."""
        self.pool.pull_weights(self.model)

    def close(self) -> None:
        """Stop the ranks this learner started."""
        if self.owns_pool:
            self.pool.close()

