"""`EngineFleet`: the learner's side of the engine actors (`taurl.scale.engine_actors`).

It places the engines (a placement group, one bundle per engine), starts them on the first
checkpoint, syncs every later version to all of them (object store or shared directory),
puts them to sleep between rounds when colocated, and stops them. The rollout workers reach
them through `RemoteEngine`; the fleet is the only one that loads weights.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from taurl.errors import Error
from taurl.scale.engine_actors import EngineActor, EnginePlacement
from taurl.scale.weight_transfer import pack_checkpoint

log = logging.getLogger("taurl.scale.engines")

WEIGHT_SYNCS = ("object_store", "shared_fs")
DEFAULT_ENGINE_RESOURCE = "engine"  # `ray start --resources '{"engine": 1}'` on the engine nodes


class EngineFleet:
    """Engine actors in a placement group, and the weight sync to them."""

    def __init__(
        self,
        ray: Any,
        actors: list[Any],
        pg: Any,
        infos: list[dict[str, Any]],
        *,
        weight_sync: str,
        colocate: bool,
        hook: Any,
        startup: dict[str, float],
    ):
        self.ray, self.actors, self.pg, self.infos = ray, actors, pg, infos
        self.weight_sync, self.colocate, self.hook = weight_sync, colocate, hook
        self._stats: dict[str, float] = dict(startup)  # reported with the next round
        self.keep: list[Any] = []  # object refs the run's actors may need again (a restart)
        self.syncs: list[dict[str, float]] = []  # every sync's times, for tests and benchmarks

    @classmethod
    def start(
        cls,
        ray: Any,
        kind: str,
        checkpoint_dir: Path,
        version: int,
        options: dict[str, Any],
        *,
        engine_options: dict[str, Any],
        seed: int,
        max_batch_size: int,
        hook: Any = None,
    ) -> EngineFleet:
        """Place `options["engines"]` engine actors and start each on `checkpoint_dir` as
        `version`. options: the backend's (engines, engine_cpus, engine_gpus, engine_resource,
        weight_sync, colocate, sleep_level)."""
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from taurl.policy.adapter import serving_dir

        hook = hook or (lambda name, info: None)
        sync, colocate = (
            options.get("weight_sync", "object_store"),
            bool(options.get("colocate", False)),
        )
        resource = options.get("engine_resource", DEFAULT_ENGINE_RESOURCE)
        has_resource = bool(resource) and not colocate and resource in ray.cluster_resources()
        placement = EnginePlacement(
            engines=options.get("engines", 1),
            cpus=options.get("engine_cpus", 1),
            gpus=options.get("engine_gpus", 0),
            resource=resource if has_resource else None,
            node_ip=driver_node_ip(ray) if colocate else None,
        )
        t0 = time.perf_counter()
        pg = placement_group(placement.bundles(), strategy=placement.strategy, name="taurl-engines")
        if not _ready(ray, pg, 120.0):
            remove_placement_group(pg)
            raise Error(
                f"Ray could not place {placement.engines} engine(s) ({placement.bundles()[0]} "
                f"each, {placement.strategy}) within 120 s: the cluster has "
                f"{ray.cluster_resources()}"
            )
        path = serving_dir(checkpoint_dir)
        weights, nbytes = (str(path), 0) if sync == "shared_fs" else _put(ray, path, version)
        actor = ray.remote(EngineActor)
        actors = [
            actor.options(
                num_cpus=placement.cpus,
                num_gpus=placement.gpus or None,
                resources={placement.resource: 1.0} if placement.resource else None,
                max_restarts=0,
                max_concurrency=1000,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i),
            ).remote(
                i,
                kind,
                weights,
                version,
                node_paths(engine_options),
                seed=seed + i,
                max_batch_size=max_batch_size,
                sleep_level=_sleep_level(options, colocate),
            )
            for i in range(placement.engines)
        ]
        try:
            infos = ray.get([a.info.remote() for a in actors])
        except ray.exceptions.RayError as e:
            for a in actors:
                ray.kill(a, no_restart=True)
            remove_placement_group(pg)
            raise Error(f"an engine actor could not start: {e}") from None
        startup_s = time.perf_counter() - t0
        log.info(
            "ray: %d %s engine(s) up in %.1fs on nodes %s (weights by %s, %.1f MB)",
            len(actors),
            kind,
            startup_s,
            [i["node_ip"] for i in infos],
            sync,
            nbytes / 1e6,
        )
        hook(
            "ray_engines_started",
            {"infos": infos, "startup_s": startup_s, "placement": placement, "weight_sync": sync},
        )
        return cls(
            ray,
            actors,
            pg,
            infos,
            weight_sync=sync,
            colocate=colocate,
            hook=hook,
            startup={"time/ray_engines_startup_s": startup_s},
        )

    def sync(self, checkpoint_dir: str | Path, version: int) -> dict[str, float]:
        """Every engine serves `checkpoint_dir` as `version` when this returns (woken first
        when asleep); the times, also reported with the next round."""
        from taurl.policy.adapter import serving_dir

        ray = self.ray
        t0 = time.perf_counter()
        path = serving_dir(checkpoint_dir)
        weights, nbytes = (
            (str(path), 0) if self.weight_sync == "shared_fs" else _put(ray, path, version)
        )
        t_put = time.perf_counter() - t0
        try:
            results = ray.get([a.load.remote(weights, version) for a in self.actors])
        except ray.exceptions.RayActorError as e:
            raise Error(
                f"an engine actor died while loading version {version}: {e} (engines are not "
                "restarted: the run stops; resume it from its last checkpoint)"
            ) from None
        finally:
            del weights  # the object store frees the bundle once no actor holds it
        stats = {
            "ray/weight_sync_s": time.perf_counter() - t0,
            "ray/weight_sync_mb": nbytes / 1e6,
            "ray/weight_put_s": t_put,
            **{
                f"ray/engine_{k}": max(r[k] for r in results)
                for k in ("wake_s", "write_s", "reload_s", "verify_s")
            },
        }
        self._stats.update(stats)
        self.syncs.append({"version": version, **stats})
        log.info(
            "ray: version %d synced to %d engine(s) in %.2fs (%s, %.1f MB)",
            version,
            len(self.actors),
            stats["ray/weight_sync_s"],
            self.weight_sync,
            nbytes / 1e6,
        )
        self.hook("weights_synced", {"version": version, **stats})
        return stats

    def after_round(self) -> None:
        """Colocated: the engines sleep until the next sync, the learner has the device."""
        if self.colocate:
            t = self.ray.get([a.sleep.remote() for a in self.actors])
            asleep = self.ray.get([a.is_sleeping.remote() for a in self.actors])
            # reported with the next round: the servers that said they slept (vLLM's /is_sleeping)
            self._stats.update({"ray/engine_sleep_s": max(t), "ray/engines_asleep": sum(asleep)})

    def take_stats(self) -> dict[str, float]:
        out, self._stats = self._stats, {}
        return out

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        try:  # what each engine sampled, by the version that served it (a log line, a hook)
            tokens = self.ray.get([a.tokens.remote() for a in self.actors], timeout=60)
            log.info("ray: tokens sampled per engine, by version: %s", tokens)
            self.hook("ray_engines_stopping", {"tokens_by_version": tokens})
        except Exception as e:  # noqa: BLE001 — an engine that died has nothing to report
            log.warning("ray: engine token counts unavailable: %s", type(e).__name__)
        for a in self.actors:
            try:
                self.ray.get(a.close.remote(), timeout=60)
            except Exception as e:  # noqa: BLE001 — a dead actor's server died with it
                log.warning("ray: engine actor close failed: %s", type(e).__name__)
            self.ray.kill(a, no_restart=True)
        remove_placement_group(self.pg)


def driver_node_ip(ray: Any) -> str:
    """The address Ray names this process's node by (its ``node:<ip>`` resource)."""
    me = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == me:
            return str(node["NodeManagerAddress"])
    return str(ray.util.get_node_ip_address())


def node_paths(engine_options: dict[str, Any]) -> dict[str, Any]:
    """`engine_options` with a relative ``python`` that exists here made absolute: an engine
    actor runs in a Ray worker, whose working directory is not the run's."""
    python = engine_options.get("python")
    if isinstance(python, str) and not Path(python).is_absolute() and Path(python).is_file():
        return {**engine_options, "python": str(Path(python).absolute())}
    return engine_options


def _put(ray: Any, path: Path, version: int) -> tuple[Any, int]:
    bundle = pack_checkpoint(path, version)
    return ray.put(bundle), bundle.nbytes


def _ready(ray: Any, pg: Any, timeout_s: float) -> bool:
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    return bool(ready)


def _sleep_level(options: dict[str, Any], colocate: bool) -> int:
    return int(options.get("sleep_level", 1)) if colocate else 0


__all__ = ["DEFAULT_ENGINE_RESOURCE", "EngineFleet", "WEIGHT_SYNCS"]
