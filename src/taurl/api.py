"""taurl from Python: `train` and `evaluate`, with everything the CLI checks checked here too.

    import taurl

    summary = taurl.train(MyEnv, tasks=my_tasks, reward=my_reward, run_dir="runs/mine",
                          rl={"updates": 20, "group_size": 8})

`env` is a registered name (``"search-v0"``) or an env factory (a class or a function
returning an `Env`; registered for you, under a name derived from it). `tasks` is a list of
`Task` (train / validation / holdout splits) or a JSONL task file. `model` is a local HF
model directory or a loaded ``(model, tokenizer)``. `reward(trajectory, task) -> float`, when
given, replaces the record's outcome component; the env's constraint and shaping components
stay as they are, and the evaluator scores with the same function. `config` is a
`TrainConfig`, a dict or a YAML file; keyword overrides win, one per section of the file
(``rl={"lr": 1e-3}``, ``eval={"tasks": 10}``, or a top-level option: ``seed=3``; the flat
names of the release before sections, ``lr=1e-3``, still work with a warning naming the new
spelling). Everything is validated (types,
unknown keys, ``imports:``, the env's options) before any file is written.

What the run directory holds: the config as trained (``config.yaml``), the given tasks as
``tasks.jsonl`` and a loaded model as ``base_model/``, so a run is described by its
directory (an in-process env factory or reward function must be given again to resume).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from taurl.envs import registry
from taurl.envs.core import Task
from taurl.envs.tasks import SPLITS, _row_problem
from taurl.errors import ConfigError, Error
from taurl.monitor.progress import console_logging, remove_console_logging
from taurl.recipe.config import TrainConfig
from taurl.recipe.options import SECTION_TYPES
from taurl.recipe.sections import merge, nest, options_of
from taurl.recipe.validate import import_modules, load_config

Reward = Callable[[Any, Task], float]

# (factory or name, reward) -> the name registered for them
_REGISTERED: dict[tuple[Any, Any], str] = {}


def train(env: str | Callable[..., Any], *, tasks: Sequence[Task] | str | Path | None = None,
          model: str | Path | tuple[Any, Any] | None = None, reward: Reward | None = None,
          config: TrainConfig | Mapping[str, Any] | str | Path | None = None, run_dir: str | Path,
          progress: bool = True, **overrides: Any) -> dict[str, Any]:
    """Train a policy on `env` (module docstring); returns summary.json's content.

    overrides: a section of the file as a dict (``rl={"updates": 2, "group_size": 4}``, only
    the keys given change) or a top-level option (``seed=3``). An env factory
    without an expert trains without SFT (``sft: none``) unless the config says otherwise.
    """
    from taurl.recipe.loop import train as run_recipe

    cfg, write = _prepare(env, tasks=tasks, model=model, reward=reward, config=config,
                          run_dir=Path(run_dir), overrides=overrides)
    write()
    # the run's lines, unless the application routes logs
    shown = console_logging() if progress else None
    try:
        return run_recipe(cfg, str(run_dir), progress=progress)
    finally:
        remove_console_logging(shown)


def evaluate(policy: str | Path, env: str | Callable[..., Any] | None = None, *,
             tasks: Sequence[Task] | str | Path | None = None, reward: Reward | None = None,
             config: TrainConfig | Mapping[str, Any] | str | Path | None = None,
             split: str = "holdout", progress: bool = True, **overrides: Any) -> Any:
    """Evaluate `policy` (a checkpoint directory, or a run directory: its current policy) on
    `split` of `env`'s tasks (or `tasks`); returns the `taurl.eval.evaluate.EvalResult`.

    Without `env` and `config`, a run directory is evaluated with the config it was trained
    with. overrides: as `train`'s (``eval={"tasks": 10, "trials": 1}``).
    """
    from taurl.data.runs import RunDir
    from taurl.envs.tasks import plan_tasks
    from taurl.eval.eval_run import evaluate_policy
    from taurl.eval.promote_run import current_checkpoint

    if split not in ("holdout", "validation"):
        raise ConfigError(f"split must be 'holdout' or 'validation' (got {split!r})")
    ckpt = Path(policy)
    if not (ckpt / "config.json").is_file():
        run = RunDir(ckpt)
        if run.latest_checkpoint() is None:
            raise ConfigError(f"{policy} is neither a checkpoint (config.json) nor a run directory "
                              "with checkpoints/v<N>")
        ckpt = current_checkpoint(run)
        if env is None and config is None and run.config.is_file():
            config = run.config
    if env is None:
        if config is None:
            raise ConfigError("evaluate needs the env: pass env= (a registered name or a factory), "
                              "or config=")
        env = _config_dict(config).get("env") or ""
    eval_only = {"sft": {"data": "none", "file": "", "expert_options": {}, "demos": 0},
                 "policy": {"warmup_options": {}, "model": str(ckpt)}}
    cfg, write = _prepare(env, tasks=tasks, model=None, reward=reward, config=config, run_dir=None,
                          overrides=merge(eval_only, nest(overrides, warn="keyword")))
    write()
    plan = plan_tasks(cfg.env, task_file=cfg.tasks, task_options=cfg.task_options, n_demos=0,
                      n_rl=0, n_eval=cfg.eval_tasks, seed=0, eval_seed=cfg.eval_seed,
                      env_config=cfg.env_config)

    def make_env() -> Any:
        made = registry.make(cfg.env, **cfg.env_kwargs())
        if cfg.system_prompt is not None:
            made.system_prompt = cfg.system_prompt
        return made

    return evaluate_policy(ckpt, getattr(plan, split), cfg.eval_config(), make_env=make_env,
                           rollout=cfg.rollout_config(cfg.eval_temperature),
                           verifier=registry.spec(cfg.env).make_verifier(), tag=f"api-{split}",
                           progress=progress)


# ---------------------------------------------------------------------------------------
# Checking the arguments (nothing is written before all of them passed)


def _prepare(env: Any, *, tasks: Any, model: Any, reward: Any, config: Any, run_dir: Path | None,
             overrides: dict[str, Any]) -> tuple[TrainConfig, Callable[[], None]]:
    """The validated TrainConfig, and the function that writes what it refers to (tasks, model)."""
    if isinstance(env, TrainConfig):
        raise ConfigError("taurl.train takes the env first and the config as config=: "
                          "taurl.train('search-v0', config=TrainConfig(...), run_dir=...)")
    data = _config_dict(config)
    overrides = nest(overrides, warn="keyword")  # old flat names: one warning, their new spelling
    # the config's imports register envs: import them before the env name is checked
    if isinstance(config, (str, Path)):
        imported = import_modules(str(config), overrides.get("imports"))
    else:
        imported = import_modules(None, [*(data.get("imports") or []),
                                         *(overrides.get("imports") or [])])
    writes: list[Callable[[], None]] = []
    extra: dict[str, Any] = {"imports": imported or None}
    if reward is not None and not callable(reward):
        raise ConfigError("reward must be a function (trajectory, task) -> float, got "
                          f"{type(reward).__name__}")
    extra["env"] = _env_name(env, reward)
    if registry.spec(extra["env"]).expert is None and not any(
            "data" in (d.get("sft") or {}) for d in (data, overrides)):
        extra["sft.data"] = "none"  # no expert to learn from: RL from the policy as it is
    # files written only after every check: set once load_config checked the rest
    later: dict[str, str] = {}
    task_text = None
    if isinstance(tasks, (str, Path)):
        extra["tasks"] = _task_file(tasks)
    elif tasks is not None:
        task_text = _task_rows(tasks)
        if run_dir is not None:
            later["tasks"] = str(run_dir / "tasks.jsonl")
            writes.append(lambda: _write_text(Path(later["tasks"]), task_text))
    if isinstance(model, (str, Path)):
        extra["policy.model"] = str(model)  # the config checks it (a directory with config.json)
    elif model is not None:
        later["policy.model"] = _model(model, run_dir, writes)
    with tempfile.TemporaryDirectory(prefix="taurl-check-") as tmp:
        if task_text is not None:  # checked as the file it will be, in a scratch copy
            extra["tasks"] = str(Path(tmp) / "tasks.jsonl")
            Path(extra["tasks"]).write_text(task_text)
        cfg = load_config(TrainConfig, data=data, overrides=merge(overrides, nest(extra)))
        if task_text is not None and run_dir is None:  # evaluation without a run directory
            later["tasks"] = str(Path(tempfile.mkdtemp(prefix="taurl-tasks-")) / "tasks.jsonl")
            Path(later["tasks"]).write_text(task_text)
    cfg = dataclasses.replace(cfg, **later)

    def write() -> None:
        for w in writes:
            w()
    return cfg, write


def _config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, TrainConfig):  # the options it sets: those that differ from the defaults
        default = TrainConfig()
        out: dict[str, Any] = {}
        for f in dataclasses.fields(config):
            if f.name in SECTION_TYPES:
                mine = options_of(f.name, getattr(config, f.name))
                base = options_of(f.name, getattr(default, f.name))
                if changed := {k: v for k, v in mine.items() if v != base[k]}:
                    out[f.name] = changed
            elif getattr(config, f.name) != getattr(default, f.name):
                out[f.name] = getattr(config, f.name)
        return out
    if isinstance(config, Mapping):  # sections (taurl.recipe.sections); old flat names warn
        return nest(dict(config), warn="keyword")
    if isinstance(config, (str, Path)):
        import yaml

        try:
            loaded = yaml.safe_load(Path(config).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read config {config}: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {config} must be a mapping of option: value")
        return nest(loaded, warn="file")  # a file's flat keys are named with their new place
    raise ConfigError("config must be a TrainConfig, a dict or a YAML file path, got "
                      f"{type(config).__name__}")


def _env_name(env: Any, reward: Reward | None) -> str:
    """The registered name to train on: `env` itself, or the name its factory (and reward) got."""
    if isinstance(env, str):
        spec = registry.spec(env)  # an unknown name: UnknownEnvError with the close matches
        if reward is None:
            return env
        key = (env, reward)
        if key not in _REGISTERED:
            name = _free_name(f"{env}+{_slug(reward)}")
            registry.register(name, _Rescored(spec.factory, reward), spec.tasks, expert=spec.expert,
                              verifier=_verifier(reward), policy_hooks=spec.policy_hooks,
                              tool_expert=spec.tool_expert)
            _REGISTERED[key] = name
        return _REGISTERED[key]
    if not callable(env):
        raise ConfigError(f"env must be a registered name or an env factory (a class or function "
                          f"returning an Env), got {type(env).__name__}")
    key = (env, reward)
    if key not in _REGISTERED:
        name = _free_name(f"{_slug(env)}-v0" if reward is None
                          else f"{_slug(env)}+{_slug(reward)}-v0")
        registry.register(name, env if reward is None else _Rescored(env, reward),
                          verifier=None if reward is None else _verifier(reward))
        _REGISTERED[key] = name
    return _REGISTERED[key]


def _slug(fn: Any) -> str:
    text = getattr(fn, "__qualname__", None) or type(fn).__name__
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "env"


def _free_name(base: str) -> str:
    name, i = base, 1
    while name in registry.registered():
        i += 1
        name = f"{base}-{i}"
    return name


def _task_file(path: str | Path) -> str:
    if not Path(path).is_file():
        raise ConfigError(f"tasks: no task file at {path} (a JSONL file, one Task per line)")
    return str(path)


def _task_rows(tasks: Any) -> str:
    """The given Tasks as task-file text (JSONL), each checked as a task file's row is."""
    if isinstance(tasks, (Task, dict)) or not isinstance(tasks, Sequence) or not tasks:
        raise ConfigError("tasks must be a non-empty list of taurl.Task (or a JSONL task file)")
    rows, problems, seen = [], [], set()
    for i, t in enumerate(tasks):
        if not isinstance(t, Task):
            problems.append(f"tasks[{i}] is a {type(t).__name__}, not a taurl.Task")
            continue
        row = {"task_id": t.task_id, "prompt": t.prompt, "answers": list(t.answers),
               "split": t.split, "metadata": dict(t.metadata)}
        if why := _row_problem(row):
            problems.append(f"tasks[{i}] ({t.task_id!r}) {why}")
        elif t.task_id in seen:
            problems.append(f"tasks[{i}]: duplicate task_id {t.task_id!r}")
        seen.add(t.task_id)
        rows.append(row)
    if problems:
        raise ConfigError(problems + [f"a Task's split is one of {SPLITS}"])
    try:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"tasks: a task's metadata is not JSON ({e})") from None


def _write_text(path: Path, text: str) -> None:
    from taurl.data.atomic import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


def _model(model: Any, run_dir: Path | None, writes: list[Callable[[], None]]) -> str:
    """Where a loaded (model, tokenizer) is saved (``RUN/base_model``) once the checks passed."""
    if not (isinstance(model, tuple) and len(model) == 2
            and all(hasattr(x, "save_pretrained") for x in model)):
        raise ConfigError("model must be a local model directory or a loaded (model, tokenizer) "
                          "pair (Hugging Face objects with save_pretrained)")
    if run_dir is None:
        raise ConfigError("a loaded (model, tokenizer) needs a run directory to be saved in")
    path = run_dir / "base_model"

    def save() -> None:
        if not (path / "config.json").is_file():  # a resumed run keeps the model it started from
            path.mkdir(parents=True, exist_ok=True)
            from taurl.policy.files import quiet_hf

            with quiet_hf():
                model[0].save_pretrained(path)
                model[1].save_pretrained(path)
    writes.append(save)
    return str(path)


# ---------------------------------------------------------------------------------------
# A reward function in place of the env's outcome


class _Rescored:
    """An env factory whose envs carry ``taurl_outcome``: the agent loop replaces the record's
    outcome component with ``reward(trajectory, task)`` (`taurl.rollout.loop`)."""

    def __init__(self, factory: Callable[..., Any], reward: Reward):
        self.factory, self.reward = factory, reward
        self.__signature__ = _signature(factory)  # the registry checks env options against it

    def __call__(self, **options: Any) -> Any:
        env = self.factory(**options)
        env.taurl_outcome = _Outcome(self.reward)
        return env


def _signature(fn: Any) -> Any:
    import inspect

    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


class _Outcome:
    """``reward(trajectory, task)`` as a versioned outcome (and as the evaluator's verifier)."""

    def __init__(self, reward: Reward):
        self.reward = reward
        self.version = str(getattr(reward, "version", "") or f"python:{_slug(reward)}")

    def __call__(self, traj: Any, task: Task) -> float:
        value = self.reward(traj, task)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value)):
            raise Error(f"reward({traj.episode_id}) returned {value!r}; it must return a finite "
                        "number")
        return float(value)


def _verifier(reward: Reward) -> Callable[[], _Outcome]:
    return lambda: _Outcome(reward)
