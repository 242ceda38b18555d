"""The engine contract: what a policy server takes and gives back.

`SamplingParams` in, `Generation` out (the sampled ids, their behaviour logprobs and the
policy version that produced every one); `Generator` is what the agent loop needs, `Engine`
what the recipe needs (weight loads, pause/resume around an update, health). Every engine
(`taurl.policy.local_engine.LocalEngine`, `taurl.policy.vllm_engine.VLLMEngine`,
`taurl.policy.router.EngineRouter`) implements it; `taurl.policy.factory.make_engine`
builds one from a config key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from taurl.errors import EngineError


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    temperature: 0 means greedy. top_p: nucleus mass kept (1.0 keeps all).
    top_k: draw among the k most likely ids only (0 keeps all).
    stop: strings that end the completion once the decoded new text contains one.
    stop_token_ids: ids that end the completion (the engine's EOS always does).
    seed: makes the draw reproducible for this request (None: the engine's generator).
    priority: lower is served first when requests wait for a place in the running batch
        (vLLM's convention); equal priorities are first come, first served. `LocalEngine`
        honours it; the vLLM client does not send it (a server runs first come, first served).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    priority: int = 0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise EngineError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise EngineError(f"top_k must be >= 0 (0 keeps every id), got {self.top_k}")
        if self.max_tokens < 1:
            raise EngineError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class Generation:
    """One completion. token_ids and logprobs: (n,), aligned."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "eos" | "length" | "abort"
    policy_version: int
    stop_matched: str | int | None = None  # the stop string or id that ended it
    prompt_tokens: int = 0
    queue_s: float = 0.0  # time waiting for a batch slot
    generate_s: float = 0.0  # time from admission to the last token


PAUSE_MODES = ("wait", "abort", "keep")


@dataclass(frozen=True)
class EngineHealth:
    """What `Engine.health` reports. ok: the engine can serve now; detail: why not."""

    ok: bool
    version: int
    paused: bool = False
    in_flight: int = 0
    detail: str = ""


@runtime_checkable
class Generator(Protocol):
    """What the agent loop needs: sample a completion (scripted engines offer only this)."""

    @property
    def version(self) -> int: ...

    @property
    def max_context(self) -> int: ...

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation: ...


@runtime_checkable
class Engine(Generator, Protocol):
    """The full engine contract the recipe needs (local, or an HTTP server).

    generate: prompt ids -> sampled ids, behaviour logprobs, finish reason, and the policy
      version that produced every token (`Generation.policy_version`).
    load_weights: serve the checkpoint at `checkpoint_dir` as policy `version`; returns
      when the new weights serve (verified, for a server). Requests that arrive meanwhile
      wait; none is served by two versions.
    pause(mode): stop serving. "wait": in-flight requests finish first; "abort": they end
      now with finish_reason "abort" and their partial tokens; "keep": they freeze and
      continue at `resume` (a weight load while any is kept is refused: it would mix two
      versions in one completion). New requests wait until `resume`.
    health: whether the engine can serve now, and its version.
    close: release what the engine holds (a server it started, connections).
    """

    async def load_weights(self, checkpoint_dir: str | Path, version: int) -> None: ...

    async def pause(self, mode: str = "wait") -> None: ...

    async def resume(self) -> None: ...

    async def health(self) -> EngineHealth: ...

    def close(self) -> None: ...


def check_pause_mode(mode: str) -> str:
    if mode not in PAUSE_MODES:
        raise EngineError(f"unknown pause mode {mode!r}; choose one of {list(PAUSE_MODES)}")
    return mode

