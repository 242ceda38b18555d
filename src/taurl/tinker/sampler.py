"""Sampling: a `LocalEngine` per set of sampler weights, and the ``asample`` request.

Each sampler serves a base model or a saved adapter (``tinker://.../sampler_weights/...``)
merged into its base, on taurl's local engine (continuous batching, token-exact output:
the sampled ids, their logprobs ``log_softmax(logits / T)[id]`` and the weights' version).
Engines are built once per weights and kept (the `MAX_ENGINES` most recent).
A request's ``num_samples`` sequences are separate engine requests (batched together by the
engine); with a ``seed``, sequence i draws with seed + i, so they differ and reproduce.
Prompt logprobs come from a plain forward of the same weights (`taurl.policy.logprobs`).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taurl.tinker.models import ModelRegistry, RequestError
from taurl.tinker.wire import SampledSeq

MAX_ENGINES = 4
DEFAULT_MAX_TOKENS = 128  # when a request sets none (the SDK's SamplingParams allows None)


@dataclass(frozen=True)
class SamplerSpec:
    """What a sampling session samples from."""

    sampler_id: str
    base_model: str
    model_path: str | None  # tinker:// path of the adapter, None: the base model
    directory: Path | None  # its directory in the run


class EnginePool:
    """Weights → `LocalEngine`, built on demand (call `engine` off the event loop)."""

    def __init__(self, models: ModelRegistry):
        self.models = models
        self._engines: OrderedDict[tuple[str, str | None], Any] = OrderedDict()
        self._lock = threading.Lock()

    def engine(self, spec: SamplerSpec) -> Any:
        from taurl.policy.local_engine import LocalEngine
        from taurl.tinker.trainer import checkpoint_meta, sampler_model

        key = (spec.base_model, spec.model_path)
        with self._lock:
            if key in self._engines:
                self._engines.move_to_end(key)
                return self._engines[key]
            base = self.models.get(spec.base_model)
            if spec.directory is None:
                model, version = base.model, 0
            else:
                model = sampler_model(base, spec.directory)
                version = int(checkpoint_meta(spec.directory).get("steps", 0))
            engine = LocalEngine(model, base.tokenizer, version=version, seed=0)
            self._engines[key] = engine
            while len(self._engines) > MAX_ENGINES:
                self._engines.popitem(last=False)[1].close()
            return engine


def prompt_tokens(model_input: Any) -> list[int]:
    """The token ids of a ``ModelInput`` (text chunks only)."""
    out: list[int] = []
    for chunk in model_input.chunks:
        if getattr(chunk, "type", None) != "encoded_text":
            raise RequestError("the prompt has image or audio chunks; this server serves text "
                               "models only")
        out.extend(int(t) for t in chunk.tokens)
    if not out:
        raise RequestError("the prompt is empty")
    return out


def engine_params(params: Any, max_context_left: int) -> list[Any]:
    """The SDK's ``SamplingParams`` as taurl's (one per sample comes later: the seed)."""
    from taurl.policy.protocol import SamplingParams

    stop = params.stop
    strings: tuple[str, ...] = ()
    ids: tuple[int, ...] = ()
    if isinstance(stop, str):
        strings = (stop,)
    elif stop:
        if all(isinstance(s, str) for s in stop):
            strings = tuple(stop)
        elif all(isinstance(s, int) for s in stop):
            ids = tuple(int(s) for s in stop)
        else:
            raise RequestError("sampling_params.stop mixes strings and token ids")
    if params.temperature < 0:
        raise RequestError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k == 0 or params.top_k < -1:
        raise RequestError(f"top_k must be -1 (no limit) or >= 1, got {params.top_k}")
    max_tokens = params.max_tokens if params.max_tokens is not None else DEFAULT_MAX_TOKENS
    if max_tokens < 1:
        raise RequestError(f"max_tokens must be >= 1, got {max_tokens}")
    if max_context_left < 1:
        raise RequestError("the prompt fills the model's whole context")
    return [SamplingParams(temperature=params.temperature, top_p=params.top_p,
                           top_k=max(params.top_k, 0), max_tokens=min(max_tokens, max_context_left),
                           stop=strings, stop_token_ids=ids, seed=params.seed)]


def check_sample_request(req: Any, prompt_len: int) -> None:
    """Refuse the ``asample`` options this server does not compute."""
    unsupported = [name for name, on in (
        ("topk_prompt_logprobs", req.topk_prompt_logprobs > 0),
        ("topk_sample_logprobs", req.topk_sample_logprobs > 0),
        ("target_prompt_logprobs", req.target_prompt_logprobs is not None),
        ("prompt_alt_tokens_k", req.prompt_alt_tokens_k > 0),
        ("record_stability_info", bool(req.record_stability_info))) if on]
    if unsupported:
        raise RequestError(f"{unsupported} are not supported by this server")
    if req.num_samples < 1:
        raise RequestError(f"num_samples must be >= 1, got {req.num_samples}")
    last_n = req.prompt_logprobs_last_n
    if last_n is not None and not 1 <= last_n <= prompt_len - 1:
        raise RequestError(f"prompt_logprobs_last_n must be in [1, {prompt_len - 1}]")


def seeds(params: Any, n: int) -> list[Any]:
    """`params` for each of `n` sequences: sequence i draws with seed + i (when seeded)."""
    from dataclasses import replace

    return [replace(params, seed=None if params.seed is None else params.seed + i)
            for i in range(n)]


async def run_sample(engine: Any, prompt: list[int], params: Any, n: int
                     ) -> list[tuple[SampledSeq, Any]]:
    """`n` sequences from `engine` (seed + i per sequence when seeded)."""
    gens = await asyncio.gather(*(engine.generate(prompt, p) for p in seeds(params, n)))
    return [(SampledSeq(g.token_ids, g.logprobs, "length" if g.finish_reason == "length"
                        else "stop"), g) for g in gens]


def prompt_logprobs(model: Any, prompt: list[int], last_n: int | None) -> list[float | None]:
    """log π(x_t | x_<t) of every prompt token (None at 0, and before the last `last_n`)."""
    from taurl.policy.logprobs import sequence_logprobs

    lps: list[float | None] = [float(x) for x in sequence_logprobs(model, prompt).tolist()]
    lps[0] = None
    if last_n is not None:
        for i in range(len(prompt) - last_n):
            lps[i] = None
    return lps
