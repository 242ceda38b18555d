"""Evaluate a checkpoint on a list of tasks: k trials each, scored by the env's verifier.

Used by the recipe (validation and holdout of the SFT and final policies) and by
`taurl eval`. Episode ids are ``eval-<tag>-<task index>-<trial>`` with seeds fixed by the
evaluation seed, task index and trial, so two checkpoints evaluated with the same config
meet the same tasks and seeds (a paired comparison).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from taurl.data.ledger import Ledger
from taurl.envs.core import Env, Task
from taurl.eval.evaluate import EvalConfig, EvalResult, summarize
from taurl.monitor.progress import phase_bar
from taurl.policy.files import load_policy_meta
from taurl.policy.local_engine import LocalEngine
from taurl.policy.model import load_policy
from taurl.rollout.episodes import EpisodeSpec, collect
from taurl.rollout.loop import RolloutConfig
from taurl.rollout.seeds import episode_seed


def evaluate_policy(path: str | Path, tasks: Sequence[Task], ecfg: EvalConfig, *,
                    make_env: Callable[[], Env],
                    rollout: RolloutConfig, verifier: Any = None, ledger: Ledger | None = None,
                    run_id: str = "eval", tag: str = "eval", progress: bool = True,
                    agent: dict | None = None,
                    placement: tuple[torch.device | str,
                                     torch.dtype] = ("cpu", torch.float32)) -> EvalResult:
    """Evaluate the policy at `path` on `tasks` (k = ecfg.trials each); an episode that
    produced no record counts as a failure (`summarize`). `placement`: the (device, dtype)
    the policy is served on (the recipe's `device`, `torch_dtype`)."""
    model, tok = load_policy(path, placement[0], dtype=placement[1])
    version = int(load_policy_meta(path).get("policy_version", 0))
    engine = LocalEngine(model, tok, version=version, max_batch_size=ecfg.concurrency,
                         seed=ecfg.seed, deterministic=ecfg.deterministic)
    specs = [EpisodeSpec(f"eval-{tag}-{i:04d}-{k}", t, episode_seed(ecfg.seed, i, k),
                         f"eval-{tag}:{t.task_id}")
             for i, t in enumerate(tasks) for k in range(ecfg.trials)]
    t0 = time.perf_counter()
    bar = phase_bar(len(specs), f"eval {tag}", "ep", enabled=progress)
    with tempfile.TemporaryDirectory() as tmp:
        # a checkpoint outside a run keeps its episodes in a scratch ledger
        own = Ledger(Path(tmp) / "ledger.sqlite") if ledger is None else None
        try:
            run = collect
            if agent:  # the user's agent through the proxy; one record per episode (its last chain)
                from taurl.proxy.collect import collect_agent

                run = functools.partial(collect_agent, agent=agent, all_chains=False)
            trajs, _ = asyncio.run(run(engine, tok, make_env, specs, config=rollout,
                                       ledger=ledger if ledger is not None else own,
                                       run_id=run_id, concurrency=ecfg.concurrency, bar=bar))
        finally:
            bar.close()
            if own is not None:
                own.close()
    split = tasks[0].split if tasks else "holdout"
    result = summarize(trajs, list(tasks), ecfg.trials, verifier=verifier,
                       wall_s=time.perf_counter() - t0, split=split)
    # the seed and temperature travel with the figures, so a paired comparison can check them
    return dataclasses.replace(result, eval_seed=ecfg.seed, temperature=rollout.temperature)
