"""Which launcher starts a driver's ranks (``train.launcher``): local processes or Ray actors.

    local  `pool.start_ranks`: `world_size` processes on this machine, or, with
           TAURL_DIST_LAUNCH=external, the ranks you started (torchrun, SLURM)
    ray    `ray_ranks.RayRankPool`: actors in a placement group on a Ray cluster
"""

from __future__ import annotations

from typing import Any

from taurl.train.distributed.pool import RankPool, start_ranks
from taurl.train.distributed.strategy import LAUNCHERS


def launch_ranks(world_size: int, device: str = "cpu", launcher: str = "local",
                 ray: dict[str, Any] | None = None, num_cpus: int | None = None) -> RankPool:
    """The started ranks of one driver; `ray`: ``train.ray``'s options, `num_cpus`: the CPUs
    of a local Ray cluster if one must be started (`ray_ranks.connect_ray`)."""
    if launcher == "local":
        return start_ranks(world_size, device)
    if launcher != "ray":
        raise ValueError(f"train.launcher must be one of {', '.join(LAUNCHERS)} (got {launcher!r})")
    from taurl.train.distributed.ray_ranks import RayRankOptions, RayRankPool

    return RayRankPool.start(world_size, device, RayRankOptions(**(ray or {}), num_cpus=num_cpus))
