"""Environment registry: ``taurl.envs.make("search-v0", **cfg)``."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from taurl.envs.core import Env
from taurl.errors import UnknownEnvError

_REGISTRY: dict[str, Callable[..., Env]] = {}


def register(name: str, factory: Callable[..., Env]) -> None:
    """Register `factory` under `name` (``family-vN``)."""
    if name in _REGISTRY:
        raise ValueError(f"environment {name!r} is already registered")
    _REGISTRY[name] = factory


def registered() -> list[str]:
    return sorted(_REGISTRY)


def make(name: str, **config: Any) -> Env:
    """Build a registered environment; unknown names get a "did you mean" hint."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownEnvError(f"no environment named {name!r}.{hint} Registered: {', '.join(registered())}")
    return _REGISTRY[name](**config)
