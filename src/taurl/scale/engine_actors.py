"""Inference engines beside the learner: engine actors that each own a server on their node.

    learner (the driver)                         engine actor i (placement group bundle i)
      checkpoint vN ── pack: bytes of the          writes vN under its node-local root,
      serving files ── ray.put, once ────────▶     reloads its vLLM server from there
                                                   (the reload + probe of `VLLMEngine`)
    rollout worker j ── RemoteEngine.generate ──▶  VLLMEngine.generate (HTTP on 127.0.0.1)
                     ◀── Generation (ids, logprobs, the version that served every token)

`EngineActor` is the engine: a `VLLMEngine` over a server it started with the vLLM venv's
python (``engine_options.python``, as in-process), or, for tests and a CPU cluster, a
`LocalEngine`. Rollout workers sample from it through `RemoteEngine`, the engine contract
over an actor handle, so the agent loop, the version recording and every exactness rule of
`VLLMEngine` (one version per completion, a verified reload) are unchanged: the version a
`Generation` carries is the one the server served when the completion ran.

Weights (``backend_options.weight_sync``): ``object_store`` (default) packs the checkpoint's
serving files (`taurl.scale.weight_transfer`), puts them into Ray's object store once, and
each actor writes them into its node-local directory, then reloads: no filesystem is shared
between the learner's node and the engines'. ``shared_fs`` passes the checkpoint's path
instead (every node must see the run directory). Each sync's time goes into the next
update's row (`EngineFleet.take_stats`).

Colocation (``backend_options.colocate``): the engines' bundles are pinned to the learner's
node (Ray's ``node:<ip>`` resource), and between rounds the servers sleep (vLLM's
``/sleep?level=L``: level 1 moves the weights to host memory and drops the KV cache,
level 2 drops both) so the learner has the device's memory for its update; a sync wakes
them (``/wake_up``) and then reloads the new weights, which level 2 needs anyway. vLLM's
sleep mode needs ``--enable-sleep-mode`` and a CUDA/ROCm device: on a CPU the server
answers /sleep but ignores it ("sleep mode is not supported on CPU"), and the flag is not
passed there (it is refused at start-up).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taurl.errors import EngineError
from taurl.policy.protocol import EngineHealth, Generation, SamplingParams
from taurl.scale.weight_transfer import WeightBundle, write_bundle


@dataclass(frozen=True)
class EnginePlacement:
    """Where the engine actors go: one placement-group bundle per engine."""

    engines: int = 1
    cpus: float = 1.0
    gpus: float = 0.0
    resource: str | None = None  # a custom resource the engine nodes have (when the cluster does)
    node_ip: str | None = None  # colocation: the learner's node

    def bundles(self) -> list[dict[str, float]]:
        """Ray placement-group bundles, one per engine."""
        b: dict[str, float] = {"CPU": self.cpus}
        if self.gpus:
            b["GPU"] = self.gpus
        if self.resource:
            b[self.resource] = 1.0
        if self.node_ip:
            b[f"node:{self.node_ip}"] = 0.001  # Ray's built-in resource of the node at that address
        return [dict(b) for _ in range(self.engines)]

    @property
    def strategy(self) -> str:
        """SPREAD: engines on different nodes where the cluster allows; PACK when colocated."""
        return "PACK" if self.node_ip else "SPREAD"


class EngineActor:
    """One engine of the run, on its node (wrapped as a Ray actor by `EngineFleet`).

    weights: a `WeightBundle` (object-store sync: Ray passes the object itself) or a
    checkpoint path (shared filesystem). kind: "vllm" (a server this actor starts and stops)
    or "local" (a `LocalEngine` in this process). options: the engine's, as in-process.
    """

    def __init__(
        self,
        index: int,
        kind: str,
        weights: WeightBundle | str,
        version: int,
        options: dict[str, Any],
        *,
        seed: int,
        max_batch_size: int,
        local_root: str | None = None,
        sleep_level: int = 0,
    ):
        from taurl.policy.tokenizer import load_tokenizer

        self.index, self.kind, self.sleep_level = index, kind, sleep_level
        self.root = (
            Path(local_root)
            if local_root
            else Path(tempfile.mkdtemp(prefix=f"taurl-engine{index}-"))
        )
        self.root.mkdir(parents=True, exist_ok=True)
        self.sleeping = False
        # sampled tokens, by the version that served them
        self.tokens_by_version: Counter[int] = Counter()
        try:
            path = self._materialise(weights, version)
            self.tokenizer = load_tokenizer(path)
            self.served_dir = path
            self.engine = _make_engine(
                kind,
                path,
                self.tokenizer,
                version,
                dict(options),
                root=self.root,
                seed=seed,
                max_batch_size=max_batch_size,
                sleep=sleep_level > 0,
            )
        except BaseException:  # no `close` follows a failed start: its weights and log go now
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _materialise(self, weights: WeightBundle | str, version: int) -> Path:
        if isinstance(weights, WeightBundle):
            if weights.version != version:
                raise EngineError(
                    f"engine {self.index}: weight bundle v{weights.version} sent as v{version}"
                )
            return write_bundle(weights, self.root / "weights")
        return Path(weights)

    async def info(self) -> dict[str, Any]:
        """Where this engine runs and what it serves."""
        import ray

        ctx = ray.get_runtime_context()
        server = getattr(self.engine, "server", None)
        return {
            "index": self.index,
            "pid": os.getpid(),
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "version": self.engine.version,
            "max_context": self.engine.max_context,
            "served_dir": str(self.served_dir),
            "root": str(self.root),
            "server_pid": server.proc.pid if server and server.proc else None,
            "url": getattr(self.engine, "url", None),
        }

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        if self.sleeping:  # a round started without a sync (a resumed run's first): wake first
            await self._wake()
        gen = await self.engine.generate(prompt_ids, sampling)
        self.tokens_by_version[gen.policy_version] += len(gen.token_ids)
        return gen

    async def load(self, weights: WeightBundle | str, version: int) -> dict[str, float]:
        """Serve `weights` as `version` (wake, write locally, reload and verify); the times."""
        t0 = time.perf_counter()
        wake_s = await self._wake() if self.sleeping else 0.0
        t1 = time.perf_counter()
        path = await asyncio.to_thread(self._materialise, weights, version)
        t2 = time.perf_counter()
        before = dict(getattr(self.engine, "stats", {}))
        await self.engine.load_weights(path, version)
        after = getattr(self.engine, "stats", {})
        self.served_dir = path
        return {
            "wake_s": wake_s,
            "write_s": t2 - t1,
            "load_s": time.perf_counter() - t2,
            "reload_s": after.get("reload_s", 0.0) - before.get("reload_s", 0.0),
            "verify_s": after.get("verify_s", 0.0) - before.get("verify_s", 0.0),
            "total_s": time.perf_counter() - t0,
        }

    async def sleep(self) -> float:
        """Free the device for the learner (colocation): vLLM's sleep at `sleep_level`."""
        if not self.sleep_level or self.sleeping or self.kind != "vllm":
            return 0.0
        t0 = time.perf_counter()
        await self.engine.pause("wait")  # nothing may be admitted while the weights are away
        await _admin(self.engine, f"/sleep?level={self.sleep_level}&mode=wait")
        self.sleeping = True
        return time.perf_counter() - t0

    async def _wake(self) -> float:
        t0 = time.perf_counter()
        await _admin(self.engine, "/wake_up")
        self.sleeping = False
        await self.engine.resume()  # VLLMEngine resumes the server and its own gate
        return time.perf_counter() - t0

    async def is_sleeping(self) -> bool:
        """What the server says (vLLM's /is_sleeping); this actor's flag for a local engine."""
        if self.kind != "vllm":
            return self.sleeping
        body = await _admin(self.engine, "/is_sleeping", method="GET")
        return bool(body.get("is_sleeping"))

    async def version(self) -> int:
        return self.engine.version

    async def tokens(self) -> dict[int, int]:
        return dict(self.tokens_by_version)

    async def pause(self, mode: str = "wait") -> None:
        await self.engine.pause(mode)

    async def resume(self) -> None:
        await self.engine.resume()

    async def health(self) -> EngineHealth:
        return await self.engine.health()

    def close(self) -> None:
        """Stop the server this actor started and remove its node-local directory."""
        try:
            self.engine.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _make_engine(
    kind: str,
    path: Path,
    tokenizer: Any,
    version: int,
    options: dict[str, Any],
    *,
    root: Path,
    seed: int,
    max_batch_size: int,
    sleep: bool,
) -> Any:
    from taurl.policy.factory import make_engine

    if kind == "vllm":
        server = dict(options.pop("server_options", None) or {})
        server.setdefault("cache_dir", str(root / "server"))  # node-local: caches and the log
        if (
            sleep and _has_accelerator()
        ):  # refused by vLLM on a CPU ("not supported on current platform")
            server["extra_args"] = (*server.get("extra_args", ()), "--enable-sleep-mode")
        options["server_options"] = server
    return make_engine(
        kind,
        path,
        tokenizer,
        version=version,
        **{"max_batch_size": max_batch_size, "seed": seed, **options},
    )


def _has_accelerator() -> bool:
    """Whether this actor was given a GPU (Ray sets CUDA_VISIBLE_DEVICES for its GPUs)."""
    return bool(os.environ.get("CUDA_VISIBLE_DEVICES", "").strip())


async def _admin(engine: Any, path: str, method: str = "POST") -> Any:
    from taurl.policy.http import request

    r = await request(method, engine.url + path, None, timeout_s=600, connect_timeout_s=5)
    if r.status != 200:
        raise EngineError(f"{method} {path} answered {r.status}: {str(r.body)[:300]}")
    return r.body


class RemoteEngine:
    """The engine contract over an `EngineActor` handle, for the rollout workers.

    The actor's engine is loaded by the learner (`EngineFleet.sync`), not by a worker:
    `load_weights` only checks that the actor serves `version` (a worker restarted by Ray
    catches up here) and refuses to go on when it does not.
    """

    def __init__(self, actor: Any, version: int, max_context: int):
        self.actor, self._version, self._max_context = actor, version, max_context

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        return self._max_context

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        return await self.actor.generate.remote([int(t) for t in prompt_ids], sampling)

    async def load_weights(self, checkpoint_dir: str | Path, version: int) -> None:
        served = await self.actor.version.remote()
        if served != version:
            raise EngineError(
                f"the engine actor serves version {served}, not {version}: the learner "
                "syncs the engines before the rollout workers (EngineFleet.sync)"
            )
        self._version = version

    async def pause(self, mode: str = "wait") -> None:
        await self.actor.pause.remote(mode)

    async def resume(self) -> None:
        await self.actor.resume.remote()

    async def health(self) -> EngineHealth:
        return await self.actor.health.remote()

    def close(self) -> None:
        pass  # the learner owns the engine actors (EngineFleet.close)


__all__ = ["EngineActor", "EnginePlacement", "RemoteEngine"]
