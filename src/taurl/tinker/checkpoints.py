"""``tinker://`` checkpoint paths, mapped onto the run directory.

    tinker://<model id>/weights/<name>           save_state: adapter + optimizer state
    tinker://<model id>/sampler_weights/<name>   save_weights_for_sampler: adapter only

live at ``RUN/tinker/<model id with ':' as '_'>/{weights,sampler_weights}/<name>/`` (peft's
``adapter_config.json`` and ``adapter_model.safetensors``, ``optimizer.pt`` for training
state, ``tinker.json``: base model, LoRA config, optimizer steps). A checkpoint is written
into a temporary directory and renamed into place (`taurl.data.atomic.replace_dir`), so a
path the service answered with is always whole. The service keeps no expiry (``ttl_seconds``
is accepted and ignored).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from taurl.tinker.models import RequestError

KINDS = {"weights": "training", "sampler_weights": "sampler"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class CheckpointPath:
    """A parsed ``tinker://`` path."""

    run_id: str  # the model id of the training client that saved it
    kind: str  # weights | sampler_weights
    name: str

    @property
    def uri(self) -> str:
        return f"tinker://{self.run_id}/{self.kind}/{self.name}"

    def directory(self, run_dir: Path) -> Path:
        return run_dir / "tinker" / self.run_id.replace(":", "_") / self.kind / self.name


def check_name(name: str) -> str:
    """A checkpoint name is one path segment of letters, digits, '.', '_' and '-'."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise RequestError(f"checkpoint name {name!r} must be 1-128 letters, digits, '.', '_' "
                           "or '-', starting with a letter or digit")
    return name


def parse(uri: str) -> CheckpointPath:
    """A ``tinker://<run>/<weights|sampler_weights>/<name>`` path, checked."""
    if not uri.startswith("tinker://"):
        raise RequestError(f"checkpoint path {uri!r} must start with 'tinker://'")
    parts = uri[len("tinker://"):].split("/")
    if len(parts) != 3 or parts[1] not in KINDS or not parts[0]:
        raise RequestError(f"checkpoint path {uri!r} is not tinker://<run>/weights/<name> or "
                           "tinker://<run>/sampler_weights/<name>")
    if not re.fullmatch(r"[A-Za-z0-9:_-]+", parts[0]):
        raise RequestError(f"checkpoint path {uri!r} names no run of this server")
    return CheckpointPath(parts[0], parts[1], check_name(parts[2]))


def existing(uri: str, run_dir: Path) -> tuple[CheckpointPath, Path]:
    """The parsed path and its directory, which must hold a checkpoint."""
    cp = parse(uri)
    directory = cp.directory(run_dir)
    if not (directory / "tinker.json").is_file():
        raise RequestError(f"no checkpoint at {uri} on this server")
    return cp, directory
