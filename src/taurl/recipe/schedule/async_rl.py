"""The asynchronous schedule (``schedule: async``): rollouts run ahead of the learner,
staleness ≤ η.

    producers (asyncio tasks on the engine, in this process):
        while capacity(running, accepted, v) > 0:            # admission
                                                             # (taurl.recipe.schedule.admission)
            start group g: G episodes of task rl[g], ids a<g>-<j>, seeds fixed by (seed, g, j)
        every episode runs on whatever weights the engine serves, and is stored in the
        ledger the moment it ends (one action segment per policy version)
    learner:
        for update u:
            wait for B complete groups, oldest first         # group-complete batches
            drop (and count) any group older than η            # the check at consumption
            learner.update(batch) → checkpoint v+1 (it records the groups it consumed)
            version v+1 now counts for admission and freshness; abort (and count)
                in-flight groups that can no longer be fresh
            swap weights in the background, while the learner takes its next batch:
                finish (in-flight actions end on the old weights) |
                interrupt (pause "abort"; the actions go on on the new weights)

Crash safety as in the sync loop: episode ids and seeds are fixed by the group index, every
episode is in the ledger as it ends, and a checkpoint records the groups trained (and
dropped, aborted) up to it. A restarted run takes every other stored complete group as
ready, resumes partial groups with their missing ids only, and starts new groups after the
highest index seen, so no stored episode is lost or stored twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from typing import Any

from taurl import chaos
from taurl.errors import Error
from taurl.monitor.alarms import Watch, low_precision
from taurl.monitor.metrics import rollout_metrics, same_reward_share
from taurl.policy.files import load_policy_meta
from taurl.recipe.record import judge_update, record_update
from taurl.recipe.schedule.admission import (
    capacity,
    split_fresh,
    staleness_stats,
)
from taurl.recipe.schedule.groups import AsyncGroup, EngineTap
from taurl.recipe.schedule.learner_proc import LearnerProcess
from taurl.rollout.episodes import EpisodeSpec, store_episode
from taurl.rollout.runner import EpisodeError, check_stored, run_one, shrunk_groups
from taurl.rollout.seeds import episode_seed
from taurl.train.checkpoint import prune_checkpoints

log = logging.getLogger("taurl.recipe.schedule")
# `episode_id`: at least 5 and 2 digits, more when they grow
EPISODE_ID = re.compile(r"^a(\d{5,})-(\d{2,})$")


def episode_id(group: int, j: int) -> str:
    return f"a{group:05d}-{j:02d}"


class AsyncSchedule:
    """Producers and the learner's batch intake of one RL phase (module docstring)."""

    def __init__(self, r: Any, collector: Any, version: int, seed: int):
        cfg = self.cfg = r.cfg
        self.r, self.engine, self.seed = r, collector.engine, seed
        self.tokenizer, self.make_env, self.run_id = (collector.tokenizer, collector.make_env,
                                                      collector.run_id)
        self.rollout = dataclasses.replace(collector.config,
                                           resume_aborted=cfg.interrupt == "interrupt")
        self.version = version
        self.v_sft = r.state["sft_version"]
        self.B, self.G, self.eta = cfg.tasks_per_update, cfg.group_size, cfg.staleness_eta
        self.max_groups = max(1, cfg.concurrency // cfg.group_size)
        self.ready: dict[int, AsyncGroup] = {}
        self.running: dict[int, AsyncGroup] = {}
        self.done_ids: dict[str, list[int]] = {"consumed": [], "dropped": [], "aborted": []}
        self.counts = {"dropped_groups": 0, "dropped_episodes": 0, "aborted_groups": 0,
                       "failed_episodes": 0,
                       "failed_groups": 0, "shrunk_groups": 0, "reused_episodes": 0}
        self.accepted = 0  # groups finished and kept: trained, or ready to be
        self.failed_in_row = 0  # groups that produced nothing since the last one kept
        self.next_group = 0
        self.changed = asyncio.Event()  # a group finished or was aborted, or the version changed
        self.stopping = False
        # set when nothing usable can be produced, or a task failed
        self.error: BaseException | None = None
        self._restore()

    # -- restart ------------------------------------------------------------------------
    def _restore(self) -> None:
        """What the newest checkpoint recorded, and the stored episodes no batch took yet."""
        meta = load_policy_meta(self.r.run.checkpoint(self.version)).get("async_groups", {})
        for k in self.done_ids:
            self.done_ids[k] = [int(i) for i in meta.get(k, [])]
        closed = {i for v in self.done_ids.values() for i in v}
        self.accepted = len(self.done_ids["consumed"])
        stored: dict[int, list[str]] = {}
        for eid in self.r.ledger.episode_ids():
            if (m := EPISODE_ID.match(eid)) and (g := int(m.group(1))) not in closed:
                stored.setdefault(g, []).append(eid)
        self.next_group = max([*closed, *stored, -1]) + 1
        for g, ids in sorted(stored.items()):
            group = self._group(g)
            specs = {s.episode_id: s for s in group.specs}
            # each one checked to be the episode its spec asks for (task, seed, temperature)
            group.episodes = {e: check_stored(self.r.ledger.get(e), specs[e],
                                              self.rollout.temperature)
                              for e in ids if e in specs}
            versions = [v for t in group.episodes.values() for v in t.policy_versions]
            group.oldest = min(versions, default=None)
            self.counts["reused_episodes"] += len(ids)
            if group.done:
                self.ready[g] = group
                self.accepted += 1
            else:
                self._launch(group)

    # -- producers ----------------------------------------------------------------------
    def _group(self, g: int) -> AsyncGroup:
        tasks = self.r.plan.rl
        task = tasks[g % len(tasks)]
        specs = [EpisodeSpec(episode_id(g, j), task, episode_seed(self.seed, "rl-async", g, j),
                             f"a{g:05d}:{task.task_id}")
                 for j in range(self.G)]
        return AsyncGroup(g, specs)

    def _launch(self, group: AsyncGroup) -> None:
        group.t_start = time.perf_counter()
        self.running[group.index] = group
        tap = EngineTap(self.engine, group)
        group.tasks = [asyncio.create_task(self._episode(group, s, tap)) for s in group.specs
                       if s.episode_id not in group.episodes]
        for t in group.tasks:
            t.add_done_callback(self._task_done)

    async def _episode(self, group: AsyncGroup, s: EpisodeSpec, tap: EngineTap) -> None:
        traj = await run_one(tap, self.make_env, self.tokenizer, s, config=self.rollout,
                             run_id=self.run_id)
        if isinstance(traj, str):  # a counted failure (taurl.rollout.runner)
            group.failed.append(f"{s.episode_id}: {traj}")
        else:
            # the ledger (disk full, read-only) or a hook may raise: that is the run's error, not
            # this episode's, and the learner waiting on this group must hear it (`fail`)
            on_stored = lambda event, t: self.r.hook(event, {"episode_id": t.episode_id})  # noqa: E731
            try:
                if store_episode(traj, self.r.ledger, group.episodes, group.failed, on_stored):
                    chaos.point("episode_stored", f"episode_id={s.episode_id}")
            except Exception as e:  # noqa: BLE001 — raised by the learner's `take`
                self.fail(e)
                return
        if group.done and group.index in self.running:
            self._finished(group)

    def _finished(self, group: AsyncGroup) -> None:
        del self.running[group.index]
        group.t_end = time.perf_counter()
        for why in group.failed:
            log.warning("episode produced no record: %s", why)
        self.counts["failed_episodes"] += len(group.failed)
        errors = [f"{e}: {t.metadata.get('error')}"
                  for e, t in group.episodes.items() if not t.valid]
        # no group to compare within, or only records an error ended: nothing to train on
        if len(group.episodes) < 2 or len(errors) == len(group.episodes):
            self.counts["failed_groups"] += 1
            self.failed_in_row += 1
            self.done_ids["dropped"].append(group.index)
            # B failed groups in a row (a sync round's worth, which stops a sync run: `close_round`)
            # stop the run at any point, not only before the first kept group: an env that breaks
            # mid-run would otherwise have its groups relaunched forever (issue 38 H3)
            if self.failed_in_row >= self.B:
                self.fail(EpisodeError(f"{self.failed_in_row} groups in a row produced no usable "
                                       "records; the first failure: "
                                       f"{(group.failed + errors or ['?'])[0]}. Fix the cause and "
                                       "run the same command again (stored episodes are kept)"))
        else:  # trained as it is; one with fewer episodes than G is counted
            self.counts["shrunk_groups"] += shrunk_groups(group.specs, group.episodes)
            self.ready[group.index] = group
            self.accepted += 1
            self.failed_in_row = 0
        self.changed.set()

    def fail(self, error: BaseException) -> None:
        """Stop producing: `error` is raised by the learner's next (or current) `take`. The first
        error wins; every task that waits on `changed` is woken."""
        if self.error is None:
            log.debug("async schedule stops: %s: %s", type(error).__name__, error)
            self.error = error
        self.stopping = True
        self.changed.set()

    def _task_done(self, task: asyncio.Task) -> None:
        """Done-callback of the producer and of every episode task: an exception that ended one
        (anything `_episode` does not catch, an exception in `admit`) stops the run with it,
        instead of leaving a group that never completes and a learner that waits forever."""
        if not task.cancelled() and (e := task.exception()) is not None:
            self.fail(e)

    def start(self) -> asyncio.Task:
        """The producer task (`produce`), watched by `_task_done`."""
        producer = asyncio.create_task(self.produce())
        producer.add_done_callback(self._task_done)
        return producer

    def admit(self) -> int:
        """Start as many new groups as `capacity` allows; returns how many."""
        n = capacity(max_concurrent=self.max_groups, running=len(self.running),
                     accepted=self.accepted,
                     version=self.version - self.v_sft, eta=self.eta, batch=self.B,
                     overprovision=self.cfg.overprovision)
        for _ in range(n):
            self._launch(self._group(self.next_group))
            self.next_group += 1
        return n

    async def produce(self) -> None:
        while not self.stopping:
            self.admit()
            await self.changed.wait()
            self.changed.clear()
            await asyncio.sleep(0)  # let the learner see the same change

    def abort(self, group: AsyncGroup, why: str) -> None:
        for t in group.tasks:
            t.cancel()
        self.running.pop(group.index, None)
        self.done_ids["aborted"].append(group.index)
        self.counts["aborted_groups"] += 1
        log.debug("group %d aborted: %s", group.index, why)
        self.changed.set()

    # -- the learner's intake -------------------------------------------------------------
    async def take(self) -> list[AsyncGroup]:
        """The next B fresh complete groups, oldest first; stale ones dropped and counted."""
        while True:
            if self.error is not None:
                raise self.error
            _, stale = split_fresh({g: self.ready[g].trajectories() for g in sorted(self.ready)},
                                   self.version, self.eta)
            for g in stale:
                group = self.ready.pop(g)
                self.accepted -= 1  # a dropped group frees its place (it was never trained)
                self.done_ids["dropped"].append(g)
                self.counts["dropped_groups"] += 1
                self.counts["dropped_episodes"] += len(group.episodes)
            if stale:
                self.changed.set()
            if len(self.ready) >= self.B:
                batch = [self.ready.pop(g) for g in sorted(self.ready)[:self.B]]
                self.done_ids["consumed"].extend(g.index for g in batch)
                return batch
            await self.changed.wait()
            self.changed.clear()
            await asyncio.sleep(0)

    def doom(self) -> None:
        """Abort in-flight groups that some token already makes older than η (counted)."""
        for g in list(self.running.values()):
            if g.oldest is not None and self.version - g.oldest > self.eta:
                self.abort(g, f"older than η={self.eta} at version {self.version}")

    def advance(self, version: int) -> None:
        """The learner is at `version`: admission and freshness count from it at once, while
        the engine may still serve an older one (that lag is staleness, bounded by η)."""
        self.version = version
        self.doom()
        self.changed.set()

    async def swap(self, checkpoint: Any, version: int) -> None:
        """Serve `version`: in-flight actions finish on the old weights, or are cut and go on."""
        if version > self.version:  # the async loop advanced already, before starting the swap
            self.advance(version)
        if self.cfg.interrupt == "interrupt":
            await self.engine.pause("abort")
            try:
                await self.engine.load_weights(checkpoint, version)
            finally:
                await self.engine.resume()
        else:
            await self.engine.load_weights(checkpoint, version)
        self.changed.set()

    async def close(self) -> int:
        """Abort what still runs after the last update; returns how many groups that was."""
        self.stopping = True
        left = list(self.running.values())
        for g in left:
            self.abort(g, "the run ended")
        await asyncio.gather(*(t for g in left for t in g.tasks), return_exceptions=True)
        return len(left)


async def _recorded(r: Any, proc: LearnerProcess, bar: Any, row: dict[str, Any], update: int,
                    version: int, t0: float, v_sft: int) -> None:
    """Once checkpoint `version` is whole on disk: its hook, the update's metrics row (so a
    row is never ahead of the checkpoints: a killed run resumes at the first update without
    one), and the retention of old checkpoints."""
    await proc.saved(version)
    r.hook("checkpoint_saved", {"version": version})
    record_update(r, bar, row, update, version, t0)
    prune_checkpoints(r.run, r.cfg.keep_checkpoints, {0, v_sft, *r.run.promoted_versions()})


async def _swapped(sched: AsyncSchedule, saving: asyncio.Task, checkpoint: Any,
                   version: int) -> None:
    """The engine loads `version` once its checkpoint is written (the engine reads the files)."""
    await saving
    await sched.swap(checkpoint, version)


def async_rl_loop(r: Any, model: Any, tok: Any, learner: Any, collector: Any, version: int,
                  first: int, seed: int) -> None:
    """The RL phase of the recipe with ``schedule: async`` (module docstring)."""
    if not hasattr(collector, "engine"):
        raise Error("schedule: async runs with backend: local only")
    asyncio.run(_loop(r, model, tok, learner, collector, version, first, seed))


# Over 60 lines on purpose: the async schedule's update loop: admit groups, learn in the learner
# process, swap weights behind, record; its awaits and their order are the schedule, kept
# visible in one body.
async def _loop(r: Any, model: Any, tok: Any, learner: Any, collector: Any, version: int,
                first: int, seed: int) -> None:
    cfg, v_sft = r.cfg, r.state["sft_version"]
    # the learner runs in its own process (taurl.recipe.schedule.learner_proc: why); `model` and
    # `learner` of this process are not used here
    # (spawned by the recipe before SFT: its imports are done)
    proc = r.learner_process or LearnerProcess()
    # building it overlaps the first rollouts
    proc.start(cfg, r.run.root, version, v_sft, seed, r.checkpoint_meta())
    sched = AsyncSchedule(r, collector, version, seed)
    bar = r.bar(cfg.updates, "rl", "update")
    bar.update(first - 1)
    # the staleness alarm checks the bound this run promises (unless alarms set their own)
    watch = Watch({"staleness_eta": cfg.staleness_eta, **cfg.alarms}, r.metrics.read(),
                  low=low_precision(cfg.precision, cfg.torch_dtype))
    producer = sched.start()
    saving: asyncio.Task | None = None  # the newest checkpoint being written, then its row recorded
    # the engine loading the newest version, behind the learner
    swapping: asyncio.Task | None = None
    ended = False  # the loop ran to its end (no error is on its way out)
    t_start = time.perf_counter()
    try:
        for update in range(first, cfg.updates + 1):
            t0 = time.perf_counter()
            before = dict(sched.counts)
            groups = await sched.take()
            t_idle = time.perf_counter() - t0
            batch = [t for g in groups for t in g.trajectories()]
            stale = staleness_stats(batch, version)
            if stale["rollout/staleness_max"] > cfg.staleness_eta:
                # split_fresh makes this impossible
                raise Error(f"update {update} would train on an episode "
                            f"{stale['rollout/staleness_max']:g} versions old (η = "
                            f"{cfg.staleness_eta})")
            in_flight = len(sched.running)
            r.hook("rollouts_stored",
                   {"update": update, "version": version, "episodes": len(batch)})
            meta = {k: list(v) for k, v in sched.done_ids.items()}
            await proc.ready()  # (only the first update can wait here: the learner process starts)
            t1 = time.perf_counter()
            # learns; checkpoint v+1 is written behind
            lstats = await proc.update(update, version, batch, meta)
            version += 1
            delta = {k: sched.counts[k] - before[k] for k in before}
            roll_s = max(g.t_end for g in groups) - min(g.t_start for g in groups)
            row = {"phase": "rl", "update": update, "policy/version": version,
                   **rollout_metrics(batch, roll_s),
                   **lstats, "rollout/groups_same_reward": same_reward_share(batch), **stale,
                   "rollout/trained_action_tokens": float(sum(t.num_action_tokens for t in batch)),
                   "rollout/dropped_stale_groups": float(delta["dropped_groups"]),
                   "rollout/dropped_stale_episodes": float(delta["dropped_episodes"]),
                   "rollout/aborted_groups": float(delta["aborted_groups"]),
                   "rollout/failed_episodes": float(delta["failed_episodes"]),
                   "rollout/shrunk_groups": float(delta["shrunk_groups"]),
                   "run/reused_episodes": float(sched.counts["reused_episodes"] if update == first
                                                else 0),
                   "rollout/carried_groups": float(in_flight + len(sched.ready)),
                   "time/learner_idle_s": t_idle, "time/rollout_s": roll_s,
                   "time/learn_s": lstats.get("learn/learn_s", 0.0),
                   # the batch's way to the learner and back (the checkpoint is written behind)
                   "time/checkpoint_s": time.perf_counter() - t1 - lstats.get("learn/learn_s", 0.0),
                   "time/update_s": time.perf_counter() - t0}
            stop = judge_update(r, watch, row, update, t_start)
            proc.commit(row)  # the checkpoint carries it (a kill before `_recorded` loses no row)
            if swapping is not None:
                await swapping  # one load at a time, in version order (and its errors surface here)
            # the learner goes on to the next batch at once; behind it, its checkpoint is
            # written, the row recorded, and the engine drains (finish) or cuts (interrupt)
            # its in-flight actions and loads the new weights
            sched.advance(version)
            saving = asyncio.create_task(_recorded(r, proc, bar, row, update, version, t0, v_sft))
            swapping = asyncio.create_task(_swapped(sched, saving, r.run.checkpoint(version),
                                                    version))
            if stop is not None:
                await saving  # the state says RL stopped after an update that is on disk
                r.save_state(**stop)
                break
        ended = True
    finally:
        # the last checkpoint: its failure is the run's (raised below, unless another error is on
        # its way)
        (save_error,
         ) = await asyncio.gather(saving, return_exceptions=True) if saving is not None else (None,)
        if swapping is not None:  # the last load: training is done, so a failure is only reported
            (res,) = await asyncio.gather(swapping, return_exceptions=True)
            if isinstance(res, Exception) and not isinstance(save_error, BaseException):
                log.warning("the engine could not load the last version after the final update "
                            "(%s: %s); the checkpoint is written and the evaluations load it "
                            "themselves",
                            type(res).__name__, res)
        proc.close(kill=not ended)  # after an error, at once: its cause is on its way out
        left = await sched.close()
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        bar.close()
    if ended and isinstance(save_error, BaseException):
        raise save_error
    if left:
        log.info("async schedule: %d group(s) still running at the end were aborted (their stored "
                 "episodes stay in the ledger)", left)
