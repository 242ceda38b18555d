"""The learner's parallelism as configured (``train: {strategy, world_size}``) and its checks."""

from __future__ import annotations

from typing import Any

STRATEGIES = ("single", "ddp", "fsdp")  # single: today's in-process Learner, no ranks


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
