"""One task instance: what an environment is reset with and the gold its verifier checks.

It lives in `data/` (the bottom layer) because everything above reads it: the rollout, the
tools, the default policy's tokenizer corpus and the recipe; `taurl.envs.core` (its public
home, `taurl.Task`) imports it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One task instance. `answers` are the gold aliases; any of them counts."""

    task_id: str
    prompt: str  # the user message
    answers: tuple[str, ...]
    split: str  # "train" | "holdout" | …
    env: str  # the env name the task belongs to
    metadata: dict[str, Any] = field(default_factory=dict)
