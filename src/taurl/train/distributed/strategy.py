"""The learner's parallelism as configured (``train: {strategy, world_size}``) and its checks."""

from __future__ import annotations

import importlib.util
from typing import Any

STRATEGIES = ("single", "ddp", "fsdp")  # single: today's in-process Learner, no ranks
LAUNCHERS = ("local", "ray")  # who starts the ranks (taurl.train.distributed.launch)
PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")  # Ray's placement strategies
RAY_KEYS = ("placement", "bundle", "ready_timeout_s")  # train.ray's options (launcher ray)


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


def launcher_problems(launcher: Any, ray: Any, strategy: Any) -> list[str]:
    """Problems with ``train.launcher`` and ``train.ray`` (`taurl.train.distributed.launch`)."""
    if launcher not in LAUNCHERS:
        return [f"train.launcher must be one of {', '.join(LAUNCHERS)} (got {launcher!r})"]
    if launcher == "local":
        return ["train.ray is for train.launcher: ray; drop it"] if ray else []
    out = []
    if strategy == "single":
        out.append("train.launcher ray starts learner ranks: it needs train.strategy ddp or fsdp")
    if importlib.util.find_spec("ray") is None:
        out.append("train.launcher ray needs the ray package: pip install 'taurl[ray]'")
    return out + ray_options_problems(ray)


def ray_options_problems(options: Any) -> list[str]:
    """What is wrong with ``train.ray`` (a mapping of `RAY_KEYS`)."""
    if not isinstance(options, dict):
        return [f"train.ray must be a mapping of {', '.join(RAY_KEYS)} (got {options!r})"]
    out = [f"unknown train.ray key {k!r} (it takes {', '.join(RAY_KEYS)})"
           for k in options if k not in RAY_KEYS]
    if options.get("placement", "PACK") not in PLACEMENTS:
        out.append(f"train.ray.placement must be one of {', '.join(PLACEMENTS)} "
                   f"(got {options['placement']!r})")
    bundle = options.get("bundle", {})
    if not isinstance(bundle, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
            for k, v in bundle.items()):
        out.append(f"train.ray.bundle must map resource names to amounts >= 0, e.g. "
                   f"{{CPU: 1, learner: 1}} (got {bundle!r})")
    wait = options.get("ready_timeout_s", 120.0)
    if not isinstance(wait, int | float) or isinstance(wait, bool) or wait <= 0:
        out.append(f"train.ray.ready_timeout_s must be a number > 0 (got {wait!r})")
    return out
