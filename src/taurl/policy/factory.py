"""Build an engine from its config key: ``local``, ``vllm``, or several behind a router."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from taurl.errors import EngineError
from taurl.policy.protocol import Engine

# engine_options of engine "local", the one list the run config and `make_engine` both check:
# `replicas` is make_engine's (N engines behind a router), the rest LocalEngine's keywords
LOCAL_ENGINE_OPTIONS = ("max_batch_size", "prefix_cache_tokens", "slim_decode", "replicas")
# LocalEngine's too, set by a run from its own keys
LOCAL_ENGINE_RUN_KEYS = ("seed", "max_context", "deterministic")


def make_engine(kind: str, checkpoint_dir: str | Path, tokenizer: Any, *, version: int,
                **options: Any) -> Engine:
    """The engine named `kind` serving the checkpoint at `checkpoint_dir` as `version`.

    kind "local": `LocalEngine` in this process over its own copy of the weights; options
      are LocalEngine's (max_batch_size, seed, max_context, prefix_cache_tokens, slim_decode,
      deterministic).
    kind "vllm": `VLLMEngine` over a vLLM OpenAI-compatible server; options are
      `VLLMEngine.from_options`'s (url, or python to start a local server; ...). The
      server is made to serve `checkpoint_dir` as `version` before this returns.
    Several engines behind one (`taurl.policy.router.EngineRouter`: an episode sticks to
    one, new episodes go to the least loaded): ``replicas: N`` (N engines of `kind`, e.g.
    N local vLLM servers), or for vllm ``url: [URL, ...]`` (one client per server).
    """
    replicas = options.pop("replicas", 1)
    urls = options.get("url")
    if isinstance(urls, (list, tuple)) or replicas != 1:
        from taurl.policy.router import EngineRouter  # lazy: only a multi-engine config

        if not isinstance(replicas, int) or replicas < 1:
            raise EngineError(f"engine_options replicas must be an integer >= 1, got {replicas!r}")
        if isinstance(urls, (list, tuple)):
            if kind != "vllm" or replicas != 1:
                raise EngineError("engine_options url as a list is for engine 'vllm', without "
                                  "replicas")
            per = [{**options, "url": u} for u in urls]
        else:
            per = [dict(options) for _ in range(replicas)]
            for i, o in enumerate(per):  # servers taurl starts: one cache and log directory each
                if isinstance(o.get("server_options"),
                              dict) and o["server_options"].get("cache_dir"):
                    o["server_options"] = {
                        **o["server_options"],
                        "cache_dir": str(Path(o["server_options"]["cache_dir"]) / f"r{i}")}
        engines: list[Engine] = []
        try:
            for o in per:
                engines.append(make_engine(kind, checkpoint_dir, tokenizer, version=version, **o))
        except BaseException:
            for e in engines:
                e.close()
            raise
        return EngineRouter(engines)
    if kind == "local":
        from taurl.policy.local_engine import LocalEngine
        from taurl.policy.model import load_policy

        # the recipe's `device` / `torch_dtype` (taurl.policy.device); not engine_options of the
        # user's
        model, _ = load_policy(checkpoint_dir, options.pop("device", "cpu"),
                               dtype=options.pop("dtype", torch.float32))
        allowed = set(LOCAL_ENGINE_OPTIONS + LOCAL_ENGINE_RUN_KEYS)
        if unknown := sorted(set(options) - allowed):
            raise EngineError(f"unknown engine_options {unknown} for engine 'local'; "
                              f"it takes {sorted(allowed)}")
        return LocalEngine(model, tokenizer, version=version, **options)
    if kind == "vllm":
        from taurl.policy.vllm_engine import VLLMEngine  # lazy: imports httpx, spawns servers

        return VLLMEngine.from_options(checkpoint_dir, tokenizer, version=version, **options)
    raise EngineError(f"unknown engine {kind!r}; choose 'local' or 'vllm'")


def async_engine_rows(concurrency: int, tasks_per_update: int, overprovision: int,
                      group_size: int) -> int:
    """The local engine's default ``max_batch_size`` under ``schedule: async``: one batch's
    worth of rows, (tasks_per_update + overprovision) · group_size, at most `concurrency`.
    Concurrency admits (η + 1) batches at once; decoding one batch's rows, oldest group first
    (SamplingParams.priority), makes batches complete one after another instead of all
    together and late (benchmarks/async_step.py measures both; the simulator's ``max_batch``)."""
    return min(concurrency, (tasks_per_update + overprovision) * group_size)


def local_engine_option_problem(options: dict[str, Any]) -> str | None:
    """Why `options` are not engine 'local''s (None when they are): the engine's own list."""
    if not (bad := sorted(set(options) - set(LOCAL_ENGINE_OPTIONS))):
        return None
    hint = "; seed comes from the config's seed" if "seed" in bad else ""
    return (f"engine_options {bad} are not options of engine 'local' "
            f"(it takes {', '.join(LOCAL_ENGINE_OPTIONS)}){hint}")
