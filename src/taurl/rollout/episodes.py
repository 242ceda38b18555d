"""Episodes with deterministic ids, stored the moment they finish, reused after a crash.

Every episode of a run has an id fixed by what it is (``r<u>-<task>-<g>`` for RL,
``demo-<i>``, ``eval-<tag>-<task>-<trial>``) and a seed derived from it, so a restarted run
re-samples exactly the episodes it had not stored yet: none is lost or stored twice.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tqdm.auto import tqdm

from taurl import chaos
from taurl.data.ledger import Ledger
from taurl.data.task import Task
from taurl.data.trajectory import Trajectory
from taurl.envs.core import Env
from taurl.rollout.loop import RolloutConfig
from taurl.rollout.runner import EpisodeError, close_round, run_one, stored_episodes

__all__ = ["Collector", "EpisodeError", "EpisodeSpec", "LocalCollector", "collect", "store_episode"]

log = logging.getLogger("taurl.rollout.episodes")


@dataclass(frozen=True)
class EpisodeSpec:
    episode_id: str
    task: Task
    seed: int
    group_id: str


def store_episode(traj: Trajectory, ledger: Ledger, out: dict[str, Trajectory], failed: list[str],
                  on_stored: Callable[[str, Trajectory], None] | None = None) -> bool:
    """Append one finished episode: hooks "episode_finished", the ledger, then "episode_stored".

    A record the ledger rejects goes to `failed` with its rule; a stored one to `out`.
    Every collector (in-process, Ray) stores through here, so the rules are one.
    """
    if on_stored is not None:
        on_stored("episode_finished", traj)
    report = ledger.append_many([traj])
    if report.rejected:
        failed.extend(f"{r.episode_id}: [{r.rule}] {r.detail}" for r in report.rejected)
        return False
    out[traj.episode_id] = traj
    if on_stored is not None:
        on_stored("episode_stored", traj)
    return True


async def collect(engine: Any, tokenizer: Any, make_env: Callable[[], Env],
                  specs: Sequence[EpisodeSpec], *,
                  config: RolloutConfig, ledger: Ledger, run_id: str, concurrency: int = 64,
                  bar: tqdm | None = None,
                  on_stored: Callable[[str, Trajectory], None] | None = None
                  ) -> tuple[list[Trajectory], dict[str, float]]:
    """The episodes of `specs`, in order: reused from the ledger, or run and appended at once.

    An episode that raises or that the ledger rejects produces no record: it is logged and
    counted (``rollout/failed_episodes``), and the rest go on. on_stored(event, traj) is
    called with "episode_finished" before an episode is appended and "episode_stored"
    after (hooks for tests and monitors; an exception there aborts the round).

    This is the built-in agent loop's collector; a user's agent acting through the training
    proxy has its own with the same contract (`taurl.proxy.collect.collect_agent`), which
    the caller passes to `LocalCollector` (the rollout stage never imports the proxy).
    """
    # a resumed round's, checked to be its own
    out = stored_episodes(ledger, specs, config.temperature)
    failed: list[str] = []

    async def one(s: EpisodeSpec) -> None:
        traj = await run_one(engine, make_env, tokenizer, s, config=config, run_id=run_id)
        if isinstance(traj, str):  # a counted failure (taurl.rollout.runner)
            failed.append(f"{s.episode_id}: {traj}")
            return
        if not store_episode(traj, ledger, out, failed, on_stored):
            return
        chaos.point("episode_stored", f"episode_id={s.episode_id}")
        if bar is not None:
            bar.update(1)

    reused_ids = set(out)
    if bar is not None:
        bar.update(len(reused_ids))
    await run_in_slots(engine, [one(s) for s in specs if s.episode_id not in out], concurrency)
    # nothing usable: the run stops with the first cause
    stats = close_round(specs, out, failed, reused_ids)
    return [out[s.episode_id] for s in specs if s.episode_id in out], stats


async def run_in_slots(engine: Any, jobs: Sequence[Coroutine[Any, Any, None]],
                       concurrency: int) -> None:
    """Run `jobs` in order, at most `concurrency` at once: each of that many slots takes the
    next job when its last one is done.

    An engine in deterministic mode (`LocalEngine`'s ``deterministic``) is told the slots
    (`join`) and when each has no job left (`leave`): its steps wait for every slot's request,
    so which episodes share a batch does not depend on timing. A slot stays joined from one
    episode to the next, so an episode ending and the next one starting is never a moment in
    which the engine steps without the newcomer.
    """
    queue = collections.deque(jobs)
    n = min(concurrency, len(queue))
    lockstep = n > 0 and getattr(engine, "deterministic", False)

    async def slot() -> None:
        try:
            while queue:
                await queue.popleft()
        finally:
            if lockstep:
                engine.leave()

    if lockstep:
        engine.join(n)
    tasks = [asyncio.ensure_future(slot()) for _ in range(n)]
    try:
        await asyncio.gather(*tasks)
    finally:  # a job that raised ends the round: the other slots stop too, and leave
        for t in tasks:
            t.cancel()
        for job in queue:  # never started: close them, or Python warns they were never awaited
            job.close()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---------------------------------------------------------------------------------------
# Collectors: where the episodes of an update run (`backend` in the config)


class Collector(Protocol):
    """Runs an update's episodes somewhere and stores them in the ledger from this process
    (its only writer). `LocalCollector`: this process's engine; `taurl.scale.ray_backend.
    RayCollector`: rollout workers on a Ray cluster. Both keep `collect`'s contract."""

    def collect(self, specs: Sequence[EpisodeSpec], *, ledger: Ledger,
                on_stored: Callable[[str, Trajectory], None] | None = None
                ) -> tuple[list[Trajectory], dict[str, float]]: ...

    def load_weights(self, checkpoint_dir: Any, version: int) -> None: ...

    def close(self) -> None: ...


@dataclass
class LocalCollector:
    """`collect` over one engine in this process (``backend: local``)."""

    engine: Any
    tokenizer: Any
    make_env: Callable[[], Env]
    config: RolloutConfig
    run_id: str
    concurrency: int = 64
    # further keyword arguments of `run`
    options: dict[str, Any] = field(default_factory=dict)
    # what runs the episodes: `collect` (the built-in agent loop), or another function with
    # its signature and contract (the proxy's `collect_agent` with the user's agent bound)
    run: Callable[..., Coroutine[Any, Any, tuple[list[Trajectory], dict[str, float]]]] = collect

    def collect(self, specs: Sequence[EpisodeSpec], *, ledger: Ledger,
                on_stored: Callable[[str, Trajectory], None] | None = None
                ) -> tuple[list[Trajectory], dict[str, float]]:
        return asyncio.run(self.run(self.engine, self.tokenizer, self.make_env, specs,
                                    config=self.config, ledger=ledger, run_id=self.run_id,
                                    concurrency=self.concurrency, on_stored=on_stored,
                                    **self.options))

    def load_weights(self, checkpoint_dir: Any, version: int) -> None:
        asyncio.run(self.engine.load_weights(checkpoint_dir, version))  # served and verified

    def release_caches(self) -> None:
        """The engine's caches of the current weights freed before the learner trains
        (`LocalEngine.release_caches`; an engine without them has nothing to free)."""
        release = getattr(self.engine, "release_caches", None)
        if release is not None:
            release()

    def close(self) -> None:
        self.engine.close()
