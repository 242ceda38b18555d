"""Learner ranks as Ray actors in a placement group (``train: {launcher: ray}``).

The same rank as the local launcher's (`taurl.train.distributed.worker.serve_drivers`), in
a Ray actor instead of a child process:

    1. a placement group of `world_size` bundles (``train.ray.bundle`` each, default
       ``{CPU: 1}``, plus ``GPU: 1`` on CUDA), strategy ``train.ray.placement`` (PACK by
       default: as few nodes as possible; SPREAD: one node each where it can), ready within
       ``ready_timeout_s`` or refused with what the cluster has free;
    2. one `RankActor` per bundle (bundle i holds rank i); each says its node's IP, its pid
       and a free port on its node;
    3. rendezvous: MASTER_ADDR is rank 0's node IP, MASTER_PORT that port (gloo on CPU,
       nccl on CUDA, as `taurl.train.distributed.group` joins it); each actor serves the
       driver, which listens on its own node's IP (an authenticated connection, as with
       local ranks) and drives them through the same `RankPool` as local processes.

A rank that dies (SIGKILL, its node lost) closes its connection: the driver's call raises
`RankDied` and the other ranks are killed (they would wait in a collective); ranks are not
restarted (a new rank cannot join a gloo/nccl group mid-run): the run stops and resumes from
its run directory. Ray is the one this process is connected to, else the cluster at
RAY_ADDRESS, else a local one started here (shut down by `close`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Listener
from typing import Any

from taurl.errors import Error
from taurl.train.distributed.group import free_port
from taurl.train.distributed.pool import RankDied, RankPool, _accept
from taurl.train.distributed.strategy import PLACEMENTS, RayPlacement
from taurl.train.distributed.wire import ADDR_ENV, DEVICE_ENV, KEY_ENV

log = logging.getLogger(__name__)
__all__ = ["PLACEMENTS", "RayPlacement", "RayRankOptions", "RayRankPool"]

@dataclass(frozen=True)
class RayRankOptions:
    """``train.ray``: where the ranks go (module docstring); `num_cpus`: the CPUs of a local
    cluster started here (the recipe adds the rollout workers' to the ranks')."""

    placement: str = "PACK"
    bundle: dict[str, float] = field(default_factory=dict)  # {} : {CPU: 1} (+ GPU: 1 on CUDA)
    ready_timeout_s: float = 120.0
    num_cpus: int | None = None

    def bundle_for(self, device: str) -> dict[str, float]:
        """One rank's bundle: the configured one, or one CPU (and one GPU on CUDA)."""
        if self.bundle:
            return dict(self.bundle)
        return {"CPU": 1.0, **({"GPU": 1.0} if device.startswith("cuda") else {})}


class RankActor:
    """One learner rank in a Ray actor (wrapped by `ray.remote` in `RayRankPool.start`)."""

    def where(self) -> tuple[str, int, int]:
        """(this node's IP, this process's pid, a port free on this node now)."""
        import ray

        ip = node_ip(ray)
        return ip, os.getpid(), free_port(ip)

    def serve(self, env: dict[str, str]) -> None:
        """Join the group `env` describes and serve one driver: the local rank's code."""
        from taurl.train.distributed.worker import serve_drivers

        os.environ.update(env)
        serve_drivers(once=True)


class ActorRank:
    """A rank actor as `RankPool` watches a process (``poll`` / ``kill`` / ``wait``): its
    `serve` call ends when the rank ends, by returning, failing or dying."""

    def __init__(self, ray: Any, actor: Any, ref: Any):
        self.ray, self.actor, self.ref = ray, actor, ref

    def poll(self) -> int | None:
        done, _ = self.ray.wait([self.ref], timeout=0)
        return 0 if done else None

    def kill(self) -> None:
        with contextlib.suppress(Exception):  # already gone, or Ray is down
            self.ray.kill(self.actor, no_restart=True)

    def wait(self, timeout: float | None = None) -> int:
        done, _ = self.ray.wait([self.ref], timeout=timeout)
        if not done:
            raise subprocess.TimeoutExpired("ray rank", timeout or 0)
        return 0

    def error(self) -> str | None:
        """Why the rank's `serve` ended, when it failed."""
        try:
            self.ray.get(self.ref, timeout=0)
        except Exception as e:  # noqa: BLE001 — reported, not handled
            return str(e)
        return None


class RayRankPool(RankPool):
    """`RankPool` over rank actors in a placement group (module docstring)."""

    def __init__(self, conns: Any, procs: list[ActorRank], listener: Listener, *, group: Any,
                 pids: list[int], nodes: list[str], owns_ray: bool, temp_dir: str | None):
        super().__init__(conns, procs, listener)  # type: ignore[arg-type]  # Popen-like
        self.group, self.pids, self.nodes = group, pids, nodes
        self.actors = list(procs)  # RankPool.close empties `procs`; these are killed after
        self.owns_ray, self.temp_dir = owns_ray, temp_dir

    @classmethod
    def start(cls, world_size: int, device: str = "cpu",  # type: ignore[override]
              options: RayRankOptions | None = None) -> RayRankPool:
        """`world_size` rank actors placed, joined and connected (module docstring, 1-3);
        on any failure the placement group (and with it its actors) is removed first."""
        opts = options or RayRankOptions()
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = opts.bundle_for(device)
        owns, temp_dir = connect_ray(ray, opts.num_cpus or int(world_size * bundle.get("CPU", 1)))
        group = listener = None
        try:
            group = placement_group([bundle] * world_size, strategy=opts.placement)
            ready, _ = ray.wait([group.ready()], timeout=opts.ready_timeout_s)
            if not ready:
                raise Error(f"Ray could not place {world_size} learner ranks of {bundle} with "
                            f"{opts.placement} in {opts.ready_timeout_s:.0f}s; the cluster has "
                            f"{ray.available_resources()} free of {ray.cluster_resources()} "
                            "(add nodes, or change train.ray.bundle / placement)")
            res = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
            actor_cls = ray.remote(RankActor)
            actors = [actor_cls.options(
                num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), resources=res,
                max_restarts=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=i)).remote() for i in range(world_size)]
            places = ray.get([a.where.remote() for a in actors], timeout=opts.ready_timeout_s)
            nodes, pids = [p[0] for p in places], [p[1] for p in places]
            key, here = os.urandom(16), node_ip(ray)
            listener = Listener((here, 0), authkey=key)
            common = {"WORLD_SIZE": str(world_size), "MASTER_ADDR": nodes[0],
                      "MASTER_PORT": str(places[0][2]), ADDR_ENV: f"{here}:{listener.address[1]}",
                      KEY_ENV: key.hex(), DEVICE_ENV: device}
            local = _local_ranks(nodes, gpus=bundle.get("GPU", 0) > 0)
            procs = [ActorRank(ray, a, a.serve.remote(
                {**common, "RANK": str(r), "LOCAL_RANK": str(local[r])}))
                for r, a in enumerate(actors)]
            try:
                conns = _accept(listener, world_size, procs)  # type: ignore[arg-type]
            except RankDied as e:
                why = "; ".join(filter(None, (p.error() for p in procs)))
                raise RankDied(f"{e}: {why}" if why else str(e)) from None
        except BaseException:
            if listener is not None:
                listener.close()
            if group is not None:
                with contextlib.suppress(Exception):
                    remove_placement_group(group)
            _disconnect(ray, owns, temp_dir)
            raise
        log.info("ray: %d learner ranks (pids %s) on nodes %s, %s", world_size, pids, nodes,
                 opts.placement)
        return cls(conns, procs, listener, group=group, pids=pids, nodes=nodes, owns_ray=owns,
                   temp_dir=temp_dir)

    def close(self, kill: bool = False) -> None:
        """The ranks end (at once with `kill`), their actors and placement group go; Ray itself
        is left up after a kill (a rank died: the rollout workers still close) and is shut
        down by the close that follows, when this pool started or joined it."""
        super().close(kill)
        ray = _ray()
        for p in self.actors:
            p.kill()
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
            self.group = None
        if not kill:
            _disconnect(ray, self.owns_ray, self.temp_dir)
            self.owns_ray = False


def node_ip(ray: Any) -> str:
    """The IP this process's Ray node registered with the cluster (its raylet's address, what
    the other nodes reach it by; the host's first interface may be another one)."""
    node = ray.get_runtime_context().get_node_id()
    return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node)


def _local_ranks(nodes: list[str], gpus: bool) -> list[int]:
    """LOCAL_RANK of each rank: 0 with GPUs (Ray shows each actor only its own GPU, so its
    device is cuda:0), else its index among the ranks on its node."""
    if gpus:
        return [0] * len(nodes)
    seen: Counter[str] = Counter()
    out = []
    for n in nodes:
        out.append(seen[n])
        seen[n] += 1
    return out


def connect_ray(ray: Any, num_cpus: int) -> tuple[bool, str | None]:
    """Ray for the ranks: the one this process is connected to (owned by whoever started it),
    else the cluster at RAY_ADDRESS (joined here), else a new local one of `num_cpus` CPUs
    (as `backend: ray` starts it). Returns (whether `close` disconnects, its temp dir)."""
    if ray.is_initialized():
        return False, None
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, configure_logging=False)
        return True, None
    from taurl.scale.ray_backend import _init_local_cluster

    temp_dir = tempfile.mkdtemp(prefix="taurl-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    _init_local_cluster(ray, num_cpus, temp_dir)
    return True, temp_dir


def _disconnect(ray: Any, owns: bool, temp_dir: str | None) -> None:
    if owns and ray.is_initialized():
        ray.shutdown()
    if owns and temp_dir:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise Error("train.launcher ray needs the ray package: pip install 'taurl[ray]'") from None
    return ray
