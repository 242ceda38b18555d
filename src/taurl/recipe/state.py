"""The state every phase of the recipe shares (`taurl.recipe.loop`): config, env spec, task
plan, run directory, ledger, metrics, and the resumable progress in ``state.json``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from taurl import envs
from taurl.data.atomic import atomic_write_text
from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.envs.core import Env
from taurl.envs.spec import EnvSpec
from taurl.envs.tasks import TaskPlan
from taurl.monitor.metrics import MetricsWriter
from taurl.recipe.config import TrainConfig

Hook = Callable[[str, dict[str, Any]], None]


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
    learner_process: Any = None  # schedule: async — the learner's process, spawned early (taurl.recipe.schedule.learner_proc)

    def make_env(self) -> Env:
        env = envs.make(self.cfg.env, **self.cfg.env_kwargs())
        if self.cfg.system_prompt is not None:
            env.system_prompt = self.cfg.system_prompt
        return env

    def save_state(self, **changes: Any) -> None:
        self.state.update(changes)
        atomic_write_text(self.run.root / "state.json", json.dumps(self.state, indent=2, sort_keys=True))

    def phase_done(self, name: str, seconds: float) -> None:
        timings = dict(self.state.get("timings", {}))
        timings[name] = timings.get(name, 0.0) + seconds
        self.save_state(timings=timings)

    def bar(self, total: int, desc: str, unit: str = "ep") -> tqdm:
        return tqdm(total=total, desc=desc, unit=unit, disable=not self.progress, leave=False)

    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint needs to be evaluated as it was trained (`taurl eval`, `taurl rollout`)."""
        c = self.cfg
        return {"recipe": {"env": c.env, "env_config": c.env_kwargs(), "system_prompt": c.system_prompt,
                           "tasks": c.tasks, "task_options": c.task_options, "imports": c.imports,
                           "rollout": dataclasses.asdict(c.rollout_config())}}
