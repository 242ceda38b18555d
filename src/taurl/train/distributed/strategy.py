"""The learner's parallelism as configured (``train: {strategy, world_size}``) and its checks."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

STRATEGIES = ("single", "ddp", "fsdp")  # single: today's in-process Learner, no ranks
LAUNCHERS = ("local", "ray")  # who starts the ranks (taurl.train.distributed.launch)
PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")  # Ray's placement strategies


def strategy_problems(strategy: Any, world_size: Any) -> list[str]:
    """Problems with a strategy and world size alone."""
    if strategy not in STRATEGIES:
        return [f"train.strategy must be one of {', '.join(STRATEGIES)} (got {strategy!r})"]
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        return [f"train.world_size must be an integer >= 1 (got {world_size!r})"]
    if strategy == "single" and world_size > 1:
        return [f"train.world_size {world_size} needs train.strategy ddp or fsdp "
                "(single is one process)"]
    return []


def launcher_problems(launcher: Any, ray: RayPlacement, strategy: Any) -> list[str]:
    """Problems with ``train.launcher`` and ``train.ray`` together
    (`taurl.train.distributed.launch`; ``train.ray``'s own values: `RayPlacement.problems`)."""
    if launcher not in LAUNCHERS:
        return [f"train.launcher must be one of {', '.join(LAUNCHERS)} (got {launcher!r})"]
    if launcher == "local":
        return ["train.ray is for train.launcher: ray; drop it"] if ray != RayPlacement() else []
    out = []
    if strategy == "single":
        out.append("train.launcher ray starts learner ranks: it needs train.strategy ddp or fsdp")
    if importlib.util.find_spec("ray") is None:
        out.append("train.launcher ray needs the ray package: pip install 'taurl[ray]'")
    return out


@dataclass(frozen=True)
class RayPlacement:
    """``train.ray``: where Ray places the learner ranks (``train.launcher: ray``;
    docs/scale-out.md); ``{}`` takes every default."""

    # Ray's placement strategy for the ranks' bundles: PACK | SPREAD | STRICT_PACK |
    # STRICT_SPREAD (PACK keeps the ranks of one step close)
    placement: str = "PACK"
    # one rank's resources, e.g. {CPU: 1, learner: 1} (a custom resource pins ranks to the
    # nodes that declare it); {}: one CPU, and one GPU on CUDA
    bundle: dict[str, float] = field(default_factory=dict)
    # seconds to wait for the ranks' bundles before refusing with what the cluster has free
    ready_timeout_s: float = 120.0

    def problems(self) -> list[str]:
        """The values out of range (keys and types are the config loader's to check)."""
        out = []
        if self.placement not in PLACEMENTS:
            out.append(f"train.ray.placement must be one of {', '.join(PLACEMENTS)} "
                       f"(got {self.placement!r})")
        if not all(isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
                   and v >= 0 for k, v in self.bundle.items()):
            out.append(f"train.ray.bundle must map resource names to amounts >= 0, e.g. "
                       f"{{CPU: 1, learner: 1}} (got {self.bundle!r})")
        if not self.ready_timeout_s > 0:
            out.append(f"train.ray.ready_timeout_s must be > 0 (got {self.ready_timeout_s!r})")
        return out
