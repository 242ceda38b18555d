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


def parallel_problems(cfg: Any) -> list[str]:
    """`strategy_problems`, and what a run with ranks does not take yet (a TrainConfig)."""
    from taurl.credit import needs_values
    from taurl.recipe.stages import stage_name

    out = strategy_problems(cfg.train_strategy, cfg.train_world_size)
    if out or cfg.train_strategy == "single":
        return out
    unsupported = [(f"a critic (rl.estimator: {cfg.estimator})", needs_values(cfg.estimator)),
                   ("rl.step_scorer", cfg.step_scorer != "none"), ("policy.lora", bool(cfg.lora)),
                   ("schedule: async", cfg.schedule == "async"),
                   (f"the {stage_name(cfg)} stage", stage_name(cfg) != "rl")]
    if bad := [name for name, on in unsupported if on]:
        out.append(f"train.strategy {cfg.train_strategy} runs the RL learner alone for now; "
                   f"{', '.join(bad)} need(s) train.strategy single")
    return out
