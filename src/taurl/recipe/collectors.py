"""The collector a recipe stage samples its rollouts with: one factory for every stage.

The RL loop and the rejection rounds (`taurl.recipe.stage_loops`) build their engine the same
way, from the same keys (``engine``, ``engine_options``, ``concurrency``, ``device``,
``torch_dtype``, ``deterministic``), so an option that works for one works for the other and
none is passed twice. ``backend: ray`` starts rollout workers that build their own engine
from the run config (`taurl.scale.ray_backend`); a stage that samples with other rollout
budgets than the config's (rejection's own temperature) is refused it at validation
(`taurl.recipe.stages.stage_problems`).
"""

from __future__ import annotations

from typing import Any

from taurl.errors import ConfigError
from taurl.policy.factory import async_engine_rows, make_engine
from taurl.rollout.budgets import RolloutConfig
from taurl.rollout.episodes import Collector, LocalCollector


def engine_options(r: Any, seed: int) -> dict[str, Any]:
    """make_engine's options for the run `r`: the user's engine_options over the run's own
    keys (batch size, seed; local: device, dtype, deterministic; vllm: a cache in the run)."""
    cfg = r.cfg
    opts = {"max_batch_size": cfg.concurrency, "seed": seed, **cfg.engine_options}
    if cfg.engine.kind == "local":  # its own copy of the weights, beside the policy
        device, dtype = r.placement()
        opts.update(device=device, dtype=dtype, deterministic=cfg.deterministic)
    own_rows = "max_batch_size" not in cfg.engine_options
    if cfg.schedule.kind == "async" and cfg.engine.kind == "local" and own_rows:
        # one batch of rows
        opts["max_batch_size"] = async_engine_rows(cfg.concurrency, cfg.tasks_per_update,
                                                   cfg.overprovision, cfg.group_size)
    if cfg.engine.kind == "vllm" and "url" not in opts:
        # a server of ours: caches and log in the run
        opts.setdefault("server_options", {}).setdefault("cache_dir", str(r.run.root / "vllm"))
    return opts


def rollout_collector(r: Any, version: int, tok: Any, *, seed: int,
                      rollout: RolloutConfig | None = None) -> Collector:
    """The collector serving checkpoint `version` of run `r`: Ray workers (backend ray) or
    `LocalCollector` over `make_engine(cfg.engine.kind, ...)`; `rollout`: the episodes' budgets
    (default: the config's)."""
    cfg = r.cfg
    rollout = rollout or cfg.rollout_config()
    # ray: rollout workers on a Ray cluster; this process stays the learner and ledger writer
    if cfg.backend == "ray":
        if rollout != cfg.rollout_config():
            raise ConfigError("backend: ray samples with the run config's rollout budgets only; "
                              "this stage needs others: use backend: local")
        from taurl.scale.ray_backend import RayCollector

        return RayCollector.start(r, r.run.checkpoint(version), version, seed=seed)
    engine = make_engine(cfg.engine.kind, r.run.checkpoint(version), tok, version=version,
                         **engine_options(r, seed))
    if cfg.agent:  # the user's agent through the training proxy: the proxy's collector
        from functools import partial

        from taurl.proxy.collect import collect_agent

        return LocalCollector(engine, tok, r.make_env, rollout, r.run.root.name, cfg.concurrency,
                              run=partial(collect_agent, agent=cfg.agent))
    return LocalCollector(engine, tok, r.make_env, rollout, r.run.root.name, cfg.concurrency)
