"""``backend: ray``: an update's episodes run on rollout workers (Ray actors) of a local
cluster; this process stays the learner and the ledger's only writer.

    driver (the recipe)                                  rollout worker i (a Ray actor process)
      EpisodeSpecs of update u  ── at most k in flight ──▶  its own env (rebuilt from the config's
                                   per worker              env name, env kwargs and imports) +
                                                           LocalEngine(checkpoint v) + agent loop
      ◀──────────── Trajectory, by object reference ──────
      validate + append to the ledger (the only writer; it refuses a duplicate id)
      after the update: every worker loads checkpoint v+1 from the run directory as v+1

Nothing about an episode depends on where it runs: its id and seed are fixed by the plan
(`taurl.rollout.episodes`), so an episode re-run elsewhere is the same episode, and each is
stored once. A worker that dies (its process killed, a crash) is restarted by Ray
(``max_restarts``); every episode it had not returned is re-run (on any live worker, up
to ``max_attempts`` tries, then counted in ``rollout/failed_episodes``): none is lost,
none stored twice. A restarted worker starts from the checkpoint it was created with, so
each episode request names the version to serve and the worker loads it first.

With ``engine: vllm`` the workers hold no engine: they sample from engine actors that each
own a vLLM server (`taurl.scale.engine_actors`), placed and synced by the driver
(`taurl.scale.engine_fleet`: a placement group, weights through the object store).

The cluster is local (``ray.init(address="local", num_cpus=...)``, no dashboard; Ray
still names the node by the machine's address in its logs), its session files in a short
temporary directory (Ray's unix sockets must stay under 107 characters), and it is shut
down and the directory removed when the collector closes (a process killed outright leaves
the directory behind). A Ray already started in this process is used and left running.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from taurl.data.ledger import Ledger
from taurl.data.trajectory import Trajectory
from taurl.errors import Error
from taurl.rollout.episodes import EpisodeSpec, store_episode
from taurl.rollout.runner import close_round, stored_episodes

log = logging.getLogger("taurl.scale.ray")


class WorkerConfig(Protocol):
    """What the collector and its workers read of the run's config (`TrainConfig` is one;
    named by its fields here, so that scale-out does not import the recipe above it)."""

    env: str
    imports: Any
    system_prompt: str | None
    torch_threads: int
    engine_options: dict[str, Any]
    backend_options: dict[str, Any]
    concurrency: int

    def env_kwargs(self) -> dict[str, Any]: ...

    def rollout_config(self, temperature: float | None = None) -> Any: ...


class RolloutWorker:
    """One rollout worker (wrapped as a Ray actor by `RayCollector`): env, engine, agent loop.

    Its methods are coroutines, so Ray runs them concurrently on the actor's event loop and
    the worker's LocalEngine batches the episodes in flight.
    """

    def __init__(self, cfg: WorkerConfig, checkpoint_dir: str, version: int, *, seed: int,
                 run_id: str, max_batch_size: int, engine_actor: Any = None, tokenizer: Any = None,
                 max_context: int = 0):
        import torch

        from taurl import envs
        from taurl.policy.factory import make_engine
        from taurl.policy.tokenizer import load_tokenizer

        envs.import_env_modules(cfg.imports)  # a worker process must register the same envs
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        self.cfg, self.run_id = cfg, run_id
        if engine_actor is not None:  # engine: vllm, an engine actor of the run (engine_actors.py)
            from taurl.scale.engine_actors import RemoteEngine

            self.tokenizer = tokenizer
            self.engine = RemoteEngine(engine_actor, version, max_context)
            self._load_lock = asyncio.Lock()
            return
        self.tokenizer = load_tokenizer(checkpoint_dir)
        self.engine = make_engine("local", checkpoint_dir, self.tokenizer, version=version,
                                  **{"max_batch_size": max_batch_size, "seed": seed,
                                     **cfg.engine_options})
        self._load_lock = asyncio.Lock()

    def make_env(self) -> Any:
        """The run's env, as `taurl.recipe.state.Run.make_env` builds it."""
        from taurl import envs

        env = envs.make(self.cfg.env, **self.cfg.env_kwargs())
        if self.cfg.system_prompt is not None:
            env.system_prompt = self.cfg.system_prompt
        return env

    async def pid(self) -> int:
        return os.getpid()

    async def load(self, checkpoint_dir: str, version: int) -> int:
        """Serve checkpoint `version` (a no-op when it already does); returns the version."""
        async with self._load_lock:
            if self.engine.version != version:
                await self.engine.load_weights(checkpoint_dir, version)
        return self.engine.version

    async def run(self, spec: EpisodeSpec, checkpoint_dir: str, version: int) -> Trajectory | str:
        """The episode of `spec` sampled by `version`, or why it produced no record."""
        from taurl.rollout.runner import run_one

        await self.load(checkpoint_dir, version)  # a restarted worker catches up first
        return await run_one(self.engine, self.make_env, self.tokenizer, spec,
                             config=self.cfg.rollout_config(),
                             # a failure is counted by the driver (taurl.rollout.runner)
                             run_id=self.run_id)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise Error("backend: ray needs the ray package: pip install 'taurl[ray]'") from None
    return ray


class RayCollector:
    """`taurl.rollout.episodes.Collector` over rollout workers on a local Ray cluster."""

    def __init__(self, workers: list[Any], checkpoint_dir: str, version: int, *, per_worker: int,
                 max_restarts: int, max_attempts: int, hook: Callable[[str, dict[str, Any]], None],
                 pids: list[int], owns_ray: bool, temp_dir: str | None, startup_s: float | None,
                 temperature: float | None = None, fleet: Any = None):
        self.fleet = fleet  # engine: vllm, the engine actors (taurl.scale.engine_fleet)
        self.workers, self.checkpoint_dir, self.version = workers, checkpoint_dir, version
        self.per_worker, self.max_restarts, self.max_attempts = (per_worker, max_restarts,
                                                                 max_attempts)
        self.hook, self.pids = hook, pids
        self._owns_ray, self._temp_dir, self.startup_s = owns_ray, temp_dir, startup_s
        self._dead: set[int] = set()  # workers whose restarts are spent
        self.temperature = temperature  # the rollouts' (a stored episode is reused only at it)

    @classmethod
    def start(cls, r: Any, checkpoint_dir: Path, version: int, *, seed: int) -> RayCollector:
        """Start the cluster (unless one runs in this process) and `workers` rollout workers
        serving `checkpoint_dir` as `version`; `r` is the recipe's `taurl.recipe.state.Run`."""
        ray, cfg = _ray(), r.cfg
        opts = cfg.backend_options
        n = opts.get("workers", 2)
        num_cpus = opts.get("num_cpus", n)
        max_restarts, max_attempts = opts.get("max_restarts", 3), opts.get("max_attempts", 3)
        t0 = time.perf_counter()
        owns, temp_dir = not ray.is_initialized(), None
        if owns:
            temp_dir = tempfile.mkdtemp(prefix="taurl-ray-",
                                        dir="/tmp" if os.path.isdir("/tmp") else None)
            _init_local_cluster(ray, num_cpus + _engine_cpus(cfg), temp_dir)
        fleet = None
        try:
            actor = ray.remote(RolloutWorker).options(  # resources: e.g. {engines: 1}, a node's
                num_cpus=num_cpus / n, max_restarts=max_restarts, max_task_retries=0,
                resources=opts.get("resources") or None)
            per_worker = max(1, math.ceil(cfg.concurrency / n))
            remote: list[dict[str, Any]] = [{} for _ in range(n)]
            if getattr(cfg, "engine", "local") != "local":  # engine actors beside the learner
                fleet, remote = _start_engines(ray, r, checkpoint_dir, version, seed=seed,
                                               workers=n)
            workers = [actor.remote(cfg, str(checkpoint_dir), version, seed=seed,
                                    run_id=r.run.root.name,
                                    max_batch_size=per_worker, **remote[i]) for i in range(n)]
            try:
                pids = ray.get([w.pid.remote() for w in workers])
            except ray.exceptions.RayActorError as e:
                raise Error(f"a Ray rollout worker could not start: {e}") from None
        except BaseException:
            if fleet is not None:
                fleet.close()
            if owns:
                ray.shutdown()
                shutil.rmtree(temp_dir, ignore_errors=True)
            raise
        startup_s = time.perf_counter() - t0
        log.info("ray: %d rollout workers (pids %s) up in %.1fs", n, pids, startup_s)
        r.hook("ray_workers_started",
               {"pids": list(pids), "startup_s": startup_s, "temp_dir": temp_dir})
        return cls(workers, str(checkpoint_dir), version, per_worker=per_worker,
                   max_restarts=max_restarts,
                   max_attempts=max_attempts, hook=r.hook, pids=list(pids), owns_ray=owns,
                   temp_dir=temp_dir, startup_s=startup_s, temperature=cfg.temperature, fleet=fleet)

    # -----------------------------------------------------------------------------------

    # Over 60 lines on purpose: the Ray collector's submit / wait / store loop with its reuse,
    # retry and failure accounting; one body so the failure policy is read in one place.
    def collect(self, specs: Sequence[EpisodeSpec], *, ledger: Ledger,
                on_stored: Callable[[str, Trajectory], None] | None = None
                ) -> tuple[list[Trajectory], dict[str, float]]:
        """`taurl.rollout.episodes.collect`'s contract, the episodes run on the workers: reused from
        the ledger, or run remotely and appended here the moment each one comes back."""
        ray = _ray()
        # a resumed round's, checked to be its own
        out = stored_episodes(ledger, specs, self.temperature)
        queue = deque(s for s in specs if s.episode_id not in out)
        reused = set(out)
        attempts: Counter[str] = Counter()
        load = Counter()  # episodes in flight per worker
        # episode ref -> (worker, spec, its pid then)
        pending: dict[Any, tuple[int, EpisodeSpec, int]] = {}
        # a failed worker's pid ref -> worker: back in rotation once it answers
        probes: dict[Any, int] = {}
        failed: list[str] = []
        deaths = restarts = reruns = 0

        def fill() -> None:
            for w in range(len(self.workers)):
                while (queue and w not in self._dead and w not in probes.values()
                       and load[w] < self.per_worker):
                    s = queue.popleft()
                    attempts[s.episode_id] += 1
                    ref = self.workers[w].run.remote(s, self.checkpoint_dir, self.version)
                    pending[ref], load[w] = (w, s, self.pids[w]), load[w] + 1
                    self.hook("episode_submitted",
                              {"episode_id": s.episode_id, "worker": w, "pid": self.pids[w],
                                                    "attempt": attempts[s.episode_id]})

        fill()
        while pending or probes:
            [ref], _ = ray.wait([*pending, *probes], num_returns=1)
            if ref in probes:  # a restarted worker answered (or is gone for good)
                w = probes.pop(ref)
                try:
                    pid = ray.get(ref)
                    restarts += pid != self.pids[w]
                    self.pids[w] = pid
                except ray.exceptions.ActorUnavailableError:  # still restarting: ask again shortly
                    time.sleep(0.2)
                    probes[self.workers[w].pid.remote()] = w
                    continue
                except ray.exceptions.RayActorError:  # ActorDiedError: its restarts are spent
                    self._dead.add(w)
                    log.warning("ray: rollout worker %d is gone for good", w)
                fill()
                continue
            w, s, pid = pending.pop(ref)
            load[w] -= 1
            try:
                result: Trajectory | str | None = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                result = None
                if w not in probes.values() and pid == self.pids[w]:
                    # a new death: ask whether it is back
                    deaths += 1
                    log.warning("ray: rollout worker %d (pid %d) died: %s", w, self.pids[w],
                                type(e).__name__)
                    probes[self.workers[w].pid.remote()] = w
                if attempts[s.episode_id] < self.max_attempts:
                    # the same id and seed: the same episode, elsewhere or later
                    queue.appendleft(s)
                    reruns += 1
                else:
                    failed.append(f"{s.episode_id}: its worker died {attempts[s.episode_id]} times")
            # before the hooks below: a worker killed from one still has its next episode in flight
            fill()
            if result is None:
                continue
            if isinstance(result, str):
                failed.append(f"{s.episode_id}: {result}")
                continue
            if result.episode_id != s.episode_id:  # a worker answering for another episode is a bug
                raise Error(f"rollout worker {w} returned episode {result.episode_id} for "
                            f"{s.episode_id}")
            store_episode(result, ledger, out, failed, on_stored)
        if queue:  # every worker is gone: stop rather than train on a silently smaller batch
            raise Error(f"every Ray rollout worker died and used up its {self.max_restarts} "
                        f"restart(s); {len(queue)} episode(s) of this update were not run (raise "
                        "backend_options max_restarts, or look for what kills the workers: memory, "
                        "the env)")
        # no record from any episode run: the run stops with the first cause, as in-process
        stats = {**close_round(specs, out, failed, reused),
                 "ray/workers": float(len(self.workers) - len(self._dead)),
                 "ray/worker_deaths": float(deaths),
                 "ray/worker_restarts": float(restarts), "ray/rerun_episodes": float(reruns)}
        if self.startup_s is not None:  # reported once, with the first update
            stats["time/ray_startup_s"], self.startup_s = self.startup_s, None
        if self.fleet is not None:  # the sync before this round (or the engines' start-up)
            stats.update(self.fleet.take_stats())
            self.fleet.after_round()  # colocated: the engines sleep while the learner runs
        return [out[s.episode_id] for s in specs if s.episode_id in out], stats

    def load_weights(self, checkpoint_dir: Any, version: int) -> None:
        """Every live worker serves `checkpoint_dir` (read from the run directory) as `version`."""
        ray = _ray()
        self.checkpoint_dir, self.version = str(checkpoint_dir), version
        if self.fleet is not None:  # the engines first: the workers then check they serve `version`
            self.fleet.sync(checkpoint_dir, version)
        live = [w for w in range(len(self.workers)) if w not in self._dead]
        refs = [self.workers[w].load.remote(self.checkpoint_dir, version) for w in live]
        for w, ref in zip(live, refs, strict=True):
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                # a worker that died here is restarted by Ray and loads `version` before its next
                # episode
                log.warning("ray: rollout worker %d died while loading version %d", w, version)

    def close(self) -> None:
        ray = _ray()
        for w in self.workers:
            ray.kill(w, no_restart=True)
        if self.fleet is not None:
            self.fleet.close()  # stops the vLLM servers the engine actors started
        if self._owns_ray:
            ray.shutdown()
            if self._temp_dir:
                shutil.rmtree(self._temp_dir, ignore_errors=True)


def _init_local_cluster(ray: Any, num_cpus: int, temp_dir: str) -> None:
    """A one-machine cluster on loopback whose workers import this taurl and the run's modules."""
    import taurl

    src = str(Path(taurl.__file__).resolve().parents[1])
    old = os.environ.get("PYTHONPATH")
    # the raylet and its workers inherit this environment: the same taurl, and modules beside you
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.getcwd(), old) if p)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        # address="local": a new cluster of our own, even where RAY_ADDRESS names another one
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir,
                 _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _engine_cpus(cfg: Any) -> int:
    """The CPUs the engine actors' bundles ask for (0 with engine: local)."""
    if getattr(cfg, "engine", "local") == "local":
        return 0
    opts = cfg.backend_options
    return math.ceil(opts.get("engines", 1) * opts.get("engine_cpus", 1))


def _start_engines(ray: Any, r: Any, checkpoint_dir: Path, version: int, *, seed: int,
                   workers: int) -> tuple[Any, list[dict[str, Any]]]:
    """The engine actors of `r`'s run, and each rollout worker's keywords to reach one
    (worker i samples from engine i mod engines)."""
    from taurl.policy.tokenizer import load_tokenizer
    from taurl.scale.engine_fleet import EngineFleet

    cfg = r.cfg
    fleet = EngineFleet.start(ray, cfg.engine, checkpoint_dir, version, cfg.backend_options,
                              engine_options=dict(cfg.engine_options), seed=seed,
                              max_batch_size=cfg.concurrency, hook=r.hook)
    # sent to the workers, who need no run directory; held by the fleet, so that a worker Ray
    # restarts still finds it in the object store (Ray frees a constructor's argument otherwise)
    fleet.keep.append(tok := ray.put(load_tokenizer(checkpoint_dir)))
    n = len(fleet.actors)
    return fleet, [{"engine_actor": fleet.actors[i % n], "tokenizer": tok,
                    "max_context": fleet.infos[i % n]["max_context"]} for i in range(workers)]
