"""`taurl serve-env NAME`: a taurl env served as an OpenEnv server, for other trainers.

    taurl serve-env reasoning-gym --env-config '{"dataset": "gcd"}' --port 8000

    from openenv.core import GenericEnvClient            # any OpenEnv client
    with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        r = env.reset(seed=3)                             # r.observation["text"]: the task
        r = env.step({"text": "<answer>4</answer>"})      # r.reward, r.done

Each OpenEnv session holds one taurl env (`taurl.envs.make(NAME, **env_config)`). ``reset``
draws the task: the `split`'s tasks from the env's own task source (with `task_options`),
the one at ``seed`` (mod their count), the one named by ``task_id``, or without either one
drawn at random (each session its own draws). The observation
carries the task's prompt (``text``), the env's system prompt, tool declarations and stop
strings, so a client can build the same prompt the recipe would. ``step`` takes the
action text exactly as taurl's loop would pass it (an inline ``<answer>…</answer>``, a
Hermes ``<tool_call>`` block) and returns the env's observation, reward and
``done = terminated or truncated``; ``info`` has the step info (stop reason, tool receipt
as a JSON object, reward components). The env's gate and sandbox apply as in training.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from typing import Any

from taurl.errors import ConfigError


def _types() -> tuple[type, type]:
    from openenv.core.env_server import Action, Observation

    class TaurlAction(Action):
        text: str

    class TaurlObservation(Observation):
        text: str = ""
        task_id: str = ""
        system_prompt: str = ""
        tools: list[dict[str, Any]] = []
        stop: list[str] = []
        info: dict[str, Any] = {}

    return TaurlAction, TaurlObservation


def _jsonable(value: Any) -> Any:
    """`value` in JSON types, for the observation: a dataclass at any depth (the step info's
    `ToolReceipt`) as an object of its fields, not its repr; what JSON cannot hold, as str."""
    def default(o: Any) -> Any:
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return dataclasses.asdict(o)
        return str(o)

    return json.loads(json.dumps(value, default=default))


def make_app(name: str, env_config: dict[str, Any] | None = None,
             task_options: dict[str, Any] | None = None,
             split: str = "train", n_tasks: int = 256, task_seed: int = 0,
             max_sessions: int = 64) -> Any:
    """The FastAPI app (openenv's `create_app`) serving env `name` (module docstring)."""
    from openenv.core.env_server import Environment, State, create_app

    from taurl import envs

    Act, Obs = _types()
    env_config, task_options = dict(env_config or {}), dict(task_options or {})
    tasks = envs.make_tasks(name, split, n=n_tasks, seed=task_seed, env_config=env_config,
                            **task_options)
    if not tasks:
        raise ConfigError(f"env {name!r} has no {split!r} tasks to serve")
    by_id = {t.task_id: t for t in tasks}
    envs.make(name, **env_config)  # its options are checked before the server starts

    class TaurlEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self.env = envs.make(name, **env_config)
            self._state = State(episode_id="", step_count=0)
            self._draw = random.Random()  # reset without seed or task_id: a task at random

        def reset(self, seed: int | None = None, episode_id: str | None = None,
                  task_id: str | None = None, **kwargs: Any) -> Any:
            if task_id is not None and task_id not in by_id:
                raise ValueError(f"task_id {task_id!r} is not among the served {split} tasks")
            if task_id is not None:
                task = by_id[task_id]
            else:  # (not task 0 every time: a client that gives no seed means "any task")
                task = tasks[seed % len(tasks)] if seed is not None else self._draw.choice(tasks)
            _, info = self.env.reset(task, seed)
            self._state = State(episode_id=episode_id or task.task_id, step_count=0)
            return Obs(text=task.prompt, task_id=task.task_id, system_prompt=self.env.system_prompt,
                       tools=_jsonable(self.env.tools), stop=list(self.env.stop),
                       info=_jsonable(info), done=False, reward=0.0)

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            obs, reward, terminated, truncated, info = self.env.step(action.text)
            self._state.step_count += 1
            return Obs(text=obs, info=_jsonable(info), done=bool(terminated or truncated),
                       reward=float(reward))

        @property
        def state(self) -> Any:
            return self._state

        def close(self) -> None:  # the session ended: its env's sandbox, sessions go too
            envs.close_env(self.env)

    return create_app(TaurlEnvironment, Act, Obs, env_name=name, max_concurrent_envs=max_sessions)


def add_serve_env_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve-env", help="serve a taurl env as an OpenEnv server (for other "
                                         "trainers)",
                       description=__doc__.split("\n\n", 1)[0])
    p.add_argument("name", metavar="NAME", help="a registered env (taurl envs)")
    p.add_argument("--env-config", default="{}", help="the env's options, JSON")
    p.add_argument("--task-options", default="{}", help="its task source's options, JSON")
    p.add_argument("--split", default="train", choices=["train", "validation", "holdout"])
    p.add_argument("--tasks", type=int, default=256, help="how many tasks of the split to serve")
    p.add_argument("--seed", type=int, default=0, help="seeds the task draw")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=64, help="concurrent OpenEnv sessions")


def run_serve_env_command(args: argparse.Namespace) -> int:
    try:
        env_config, task_options = json.loads(args.env_config), json.loads(args.task_options)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--env-config / --task-options must be JSON objects: {e}") from e
    app = make_app(args.name, env_config, task_options, args.split, args.tasks, args.seed,
                   args.max_sessions)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
