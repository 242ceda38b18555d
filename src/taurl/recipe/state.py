"""The state every phase of the recipe shares (`taurl.recipe.loop`): config, env spec, task
plan, run directory, ledger, metrics, and the resumable progress in ``state.json``."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from taurl import envs
from taurl.data.atomic import atomic_write_text
from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.envs.checker import check_env
from taurl.envs.core import Env, Task, episode_env
from taurl.envs.spec import EnvSpec
from taurl.envs.tasks import TaskPlan
from taurl.errors import EnvCheckError
from taurl.monitor.metrics import MetricsWriter
from taurl.monitor.progress import phase_bar
from taurl.policy.device import resolve_device, resolve_dtype
from taurl.recipe.config import TrainConfig
from taurl.reward.judged import is_judged, shared_judge

Hook = Callable[[str, dict[str, Any]], None]
log = logging.getLogger("taurl.recipe")


def make_env(cfg: TrainConfig) -> Env:
    """The run's env: its registration, the config's env options and system prompt, and with
    ``reward.kind: judge`` the run's judge as its outcome (`taurl.reward.judged`)."""
    env = envs.make(cfg.env, **cfg.env_kwargs())
    if cfg.system_prompt is not None:
        env.system_prompt = cfg.system_prompt
    if is_judged(cfg.reward):
        env.taurl_outcome = shared_judge(cfg.reward)
    return env


def env_provenance(env: Env, cfg: TrainConfig) -> dict[str, Any]:
    """Which world the run trained and was evaluated in, for summary.json: the env's name and
    version, what an adapter reports of its source (``env.provenance``: the package, its
    version, the env id) and the seeds that drew the tasks."""
    return {"env": cfg.env, "env_version": env.version,
            **dict(getattr(env, "provenance", {}) or {}),
            "seed": cfg.seed, "eval_seed": cfg.eval_seed}


def check_run_env(cfg: TrainConfig, task: Task, seed: int) -> dict[str, Any]:
    """`taurl.envs.check_env` on the run's env (registered or imported) and one of its tasks,
    before any work: an env that breaks the protocol is refused here, with what to fix,
    instead of failing every episode later. Returns the metrics row that records the check."""
    t0 = time.perf_counter()
    try:
        with episode_env(lambda: make_env(cfg)) as env:  # closed after the check (a server session)
            check_env(env, task, seed=seed)
    except EnvCheckError as e:
        raise EnvCheckError(f"the env {cfg.env!r} failed taurl's env check on task "
                            f"{task.task_id!r}: {e} (reproduce it with "
                            f"taurl.envs.check_env(taurl.envs.make({cfg.env!r}), task))") from None
    seconds = time.perf_counter() - t0
    log.info("env check: %s passed on task %s in %.2fs", cfg.env, task.task_id, seconds)
    return {"phase": "env_check", "env/check_passed": 1.0, "env/check_s": seconds,
            "env/check_task": task.task_id}


@dataclass
class Run:
    """What every phase shares: the config, the env's spec, the tasks and the run directory."""

    cfg: TrainConfig
    spec: EnvSpec
    plan: TaskPlan
    run: RunDir
    ledger: Ledger
    metrics: MetricsWriter
    progress: bool = True
    hook: Hook = lambda name, info: None  # noqa: E731 — events for tests and monitors
    state: dict[str, Any] = field(default_factory=dict)
    # schedule: async — the learner's process, spawned early (taurl.recipe.schedule.learner_proc)
    learner_process: Any = None

    def make_env(self) -> Env:
        return make_env(self.cfg)

    def save_state(self, **changes: Any) -> None:
        self.state.update(changes)
        atomic_write_text(self.run.root / "state.json",
                          json.dumps(self.state, indent=2, sort_keys=True))

    def phase_done(self, name: str, seconds: float) -> None:
        timings = dict(self.state.get("timings", {}))
        timings[name] = timings.get(name, 0.0) + seconds
        self.save_state(timings=timings)

    def bar(self, total: int, desc: str, unit: str = "ep") -> Any:
        """The phase's progress (`taurl.monitor.progress.phase_bar`: a bar on a terminal, plain
        lines else)."""
        return phase_bar(total, desc, unit, enabled=self.progress)

    def placement(self) -> tuple[torch.device, torch.dtype]:
        """Where the policy and the models that follow it live (`device`, `torch_dtype`)."""
        return resolve_device(self.cfg.device), resolve_dtype(self.cfg.torch_dtype)

    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint needs to be evaluated as it was trained (`taurl eval`, `taurl
        rollout`)."""
        c = self.cfg
        return {"recipe": {"env": c.env, "env_config": c.env_kwargs(),
                           "system_prompt": c.system_prompt,
                           "tasks": c.tasks, "task_options": c.task_options, "imports": c.imports,
                           "rollout": dataclasses.asdict(c.rollout_config())}}
