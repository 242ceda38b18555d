"""Environment registry: ``taurl.envs.make("search-v0", **cfg)`` and its task source."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any

from taurl.envs.core import Env, Task
from taurl.errors import ConfigError, UnknownEnvError

_REGISTRY: dict[str, Callable[..., Env]] = {}
_TASKS: dict[str, Callable[..., list[Task]]] = {}


def register(name: str, factory: Callable[..., Env], tasks: Callable[..., list[Task]] | None = None) -> None:
    """Register `factory` under `name` (``family-vN``).

    tasks: ``tasks(split, n, seed, **options) -> list[Task]``, the env's task source
    (optional); its keyword options (e.g. search-v0's ``families``, ``split_by``) are
    whatever it declares.
    """
    if name in _REGISTRY:
        raise ValueError(f"environment {name!r} is already registered")
    _REGISTRY[name] = factory
    if tasks is not None:
        _TASKS[name] = tasks


def registered() -> list[str]:
    return sorted(_REGISTRY)


def _check(name: str) -> None:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownEnvError(f"no environment named {name!r}.{hint} Registered: {', '.join(registered())}")


def make(name: str, **config: Any) -> Env:
    """Build a registered environment; unknown names get a "did you mean" hint."""
    _check(name)
    return _REGISTRY[name](**config)


def task_option_problems(name: str, options: dict[str, Any]) -> list[str]:
    """What is wrong with `options` for env `name`'s task source (empty when all is well)."""
    _check(name)
    if name not in _TASKS:
        return [f"environment {name!r} has no registered task source; pass tasks yourself"]
    params = inspect.signature(_TASKS[name]).parameters
    fixed = {"split", "n", "seed"}
    accepted = set(params) - fixed
    problems = [f"task option {o!r} is not an option: it is make_tasks' own argument" for o in sorted(set(options) & fixed)]
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        problems += [f"{name}'s task source has no option {o!r}; its options: {', '.join(sorted(accepted)) or 'none'}"
                     for o in sorted(set(options) - accepted - fixed)]
    return problems


def make_tasks(name: str, split: str, n: int, seed: int = 0, **options: Any) -> list[Task]:
    """`n` tasks of `split` from the env's registered task source, with its `options`."""
    _check(name)
    if name not in _TASKS:
        raise UnknownEnvError(f"environment {name!r} has no registered task source; pass tasks yourself")
    if problems := task_option_problems(name, options):
        raise ConfigError(problems)
    return _TASKS[name](split, n=n, seed=seed, **options)
