"""The async schedule's records of its groups in flight, and the engine as one episode sees it.

Split from `taurl.recipe.schedule.async_rl` so that module holds the schedule's logic
(admission, taking batches, version swaps); these two classes only record what a group's
episodes did (which finished or failed, the oldest policy version that sampled them).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from taurl.data.trajectory import Trajectory
from taurl.rollout.episodes import EpisodeSpec


class EngineTap:
    """The engine, as one episode sees it: records the oldest version that served it, so a
    group that can no longer be fresh is known while it still runs."""

    def __init__(self, engine: Any, group: AsyncGroup):
        self._engine, self._group = engine, group

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, prompt_ids: Any, sampling: Any) -> Any:
        # older groups first: a batch completes as soon as the engine can finish it, instead
        # of every batch in flight sharing the engine and completing late together
        sampling = dataclasses.replace(sampling, priority=self._group.index)
        gen = await self._engine.generate(prompt_ids, sampling)
        if gen.token_ids:
            g = self._group
            g.oldest = gen.policy_version if g.oldest is None else min(g.oldest, gen.policy_version)
        return gen


@dataclass
class AsyncGroup:
    """One group of G episodes of one task, as the async schedule starts, tracks and trains it."""

    index: int
    specs: list[EpisodeSpec]
    episodes: dict[str, Trajectory] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    tasks: list[asyncio.Task] = field(default_factory=list)
    oldest: int | None = None  # oldest policy version that sampled any of its tokens so far
    t_start: float = 0.0
    t_end: float = 0.0

    @property
    def done(self) -> bool:
        return len(self.episodes) + len(self.failed) >= len(self.specs)

    def trajectories(self) -> list[Trajectory]:
        return [self.episodes[s.episode_id] for s in self.specs if s.episode_id in self.episodes]
