"""`EngineRouter`: several engines (vLLM servers, LocalEngines) behind one engine contract.

Routing: an episode sticks to one engine (every turn's prompt extends the previous one,
so the server's prefix cache holds it), and new episodes go to the engine with the
fewest requests in flight (ties: fewest episodes assigned so far, then the lowest index).
The agent loop names its episode through `routing_key` (a context variable that
`taurl.rollout.loop.run_episode` sets), so the engine protocol stays `generate(ids, sampling)`.
A call with no key is balanced by load alone.

Weights: `load_weights` loads the same checkpoint on every engine at once and returns
when all serve it, so every `Generation.policy_version` is the one version of the
router. A failing engine fails the load (the run stops with its message) rather than
leaving the fleet on two versions.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from taurl.errors import EngineError
from taurl.policy.protocol import Engine, EngineHealth, Generation, SamplingParams

routing_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("taurl_routing_key",
                                                                         default=None)


class EngineRouter:
    """One engine over `engines` (≥ 1), sticky per episode, balanced across episodes."""

    def __init__(self, engines: Sequence[Engine], max_sticky: int = 100_000):
        if not engines:
            raise EngineError("EngineRouter needs at least one engine")
        versions = {e.version for e in engines}
        if len(versions) != 1:
            raise EngineError(f"the engines serve different policy versions {sorted(versions)}; "
                              "load one checkpoint on all of them first")
        self.engines = list(engines)
        self._in_flight = [0] * len(engines)
        self._assigned = [0] * len(engines)
        self._sticky: OrderedDict[str, int] = OrderedDict()  # episode key -> engine, oldest first
        self._max_sticky = max_sticky
        self.stats = {"requests": [0] * len(engines), "episodes": [0] * len(engines)}

    @property
    def version(self) -> int:
        return self.engines[0].version

    @property
    def max_context(self) -> int:
        return min(e.max_context for e in self.engines)

    def pick(self, key: str | None) -> int:
        """The engine for an episode `key`: its sticky one, else the least loaded."""
        if key is not None and key in self._sticky:
            self._sticky.move_to_end(key)
            return self._sticky[key]
        i = min(range(len(self.engines)), key=lambda j: (self._in_flight[j], self._assigned[j], j))
        if key is not None:
            self._sticky[key] = i
            self._assigned[i] += 1
            self.stats["episodes"][i] += 1
            while len(self._sticky) > self._max_sticky:  # finished episodes age out
                self._sticky.popitem(last=False)
        return i

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        i = self.pick(routing_key.get())
        self._in_flight[i] += 1
        self.stats["requests"][i] += 1
        try:
            return await self.engines[i].generate(prompt_ids, sampling)
        finally:
            self._in_flight[i] -= 1

    async def load_weights(self, checkpoint_dir: str | Path, version: int) -> None:
        results = await asyncio.gather(*(e.load_weights(checkpoint_dir, version)
                                         for e in self.engines),
                                       return_exceptions=True)
        if failed := [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]:
            i, err = failed[0]
            raise EngineError(f"{len(failed)} of {len(self.engines)} engines failed to load "
                              f"version {version} (engine {i}: {err}); the fleet would serve two "
                              "versions, so the update stops")
        self._sticky.clear()  # the prefix caches were dropped with the old weights

    async def pause(self, mode: str = "wait") -> None:
        await asyncio.gather(*(e.pause(mode) for e in self.engines))

    async def resume(self) -> None:
        await asyncio.gather(*(e.resume() for e in self.engines))

    async def health(self) -> EngineHealth:
        hs = await asyncio.gather(*(e.health() for e in self.engines))
        bad = [f"engine {i}: {h.detail or 'not ok'}" for i, h in enumerate(hs) if not h.ok]
        return EngineHealth(ok=not bad, version=self.version, paused=any(h.paused for h in hs),
                            in_flight=sum(h.in_flight for h in hs), detail="; ".join(bad))

    def close(self) -> None:
        for e in self.engines:
            e.close()
