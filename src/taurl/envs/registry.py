"""Environment registry: ``taurl.envs.make("search-v0", **cfg)`` and its task source."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from taurl.envs.core import Env, Task
from taurl.errors import UnknownEnvError

_REGISTRY: dict[str, Callable[..., Env]] = {}
_TASKS: dict[str, Callable[..., list[Task]]] = {}


def register(name: str, factory: Callable[..., Env], tasks: Callable[..., list[Task]] | None = None) -> None:
    """Register `factory` under `name` (``family-vN``).

    tasks: ``tasks(split, n, seed) -> list[Task]``, the env's task source (optional).
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


def make_tasks(name: str, split: str, n: int, seed: int = 0) -> list[Task]:
    """`n` tasks of `split` from the env's registered task source."""
    _check(name)
    if name not in _TASKS:
        raise UnknownEnvError(f"environment {name!r} has no registered task source; pass tasks yourself")
    return _TASKS[name](split, n=n, seed=seed)
