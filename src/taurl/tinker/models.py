"""The base models the service serves: names a client may pass as ``base_model``.

``taurl serve-tinker --model NAME`` serves any model taurl can load (a local HF directory, a
registry name such as ``smollm2-135m-instruct``, a GGUF file, a Hub id already cached);
``--model ALIAS=NAME`` serves it under another name (``Qwen/Qwen3-8B=/path/to/dir``), so
code written for the hosted service runs unchanged. Each is loaded once, on first use.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class RequestError(Exception):
    """A request the service refuses (the client's fault): a failed future with category
    ``user``, or HTTP 400 where the endpoint answers at once."""


class UnknownId(RequestError):
    """A request that names a session, model, sampler or future the server does not have
    (HTTP 404 where the endpoint answers at once)."""


@dataclass
class BaseModel:
    """A loaded base model: its name, directory, (eval-mode) weights and tokenizer."""

    name: str
    path: Path
    model: Any
    tokenizer: Any

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().num_embeddings)

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


def parse_model_args(specs: list[str]) -> dict[str, str]:
    """``--model`` values as {name clients use: what taurl loads}."""
    out: dict[str, str] = {}
    for spec in specs:
        name, _, target = spec.partition("=") if "=" in spec else (spec, "", spec)
        out[name] = target
    return out


class ModelRegistry:
    """Names → base models, loaded lazily and once (thread-safe)."""

    def __init__(self, specs: dict[str, str]):
        self.specs = dict(specs)
        self._loaded: dict[str, BaseModel] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    def check(self, name: str | None) -> str:
        """`name` if the service serves it, else a `RequestError` that lists what it serves."""
        if name not in self.specs:
            raise RequestError(f"unknown base model {name!r}; this server serves {self.names} "
                               "(start it with --model NAME for another)")
        return name

    def get(self, name: str) -> BaseModel:
        self.check(name)
        with self._lock:
            if name not in self._loaded:
                from taurl.policy.model import load_policy
                from taurl.policy.sources import resolve_model

                path = resolve_model(self.specs[name]).path
                model, tok = load_policy(path)
                self._loaded[name] = BaseModel(name, path, model.eval(), tok)
            return self._loaded[name]
