"""Injected tool latency: an env wrapper whose tool calls take a heavy-tailed time.

For benchmarks and tests of the schedules (`benchmarks/_async_real.py`,
tests/test_async_schedule.py): real tools make the model wait (retrieval, sandboxes, web
calls), and the slowest few episodes hold a synchronous batch. The delay of a tool call is

    d = min(max_s, LogNormal(μ, σ)),  μ = ln(mean_s) − σ²/2   (so E[LogNormal] = mean_s)

drawn from a generator seeded by the episode's seed, so a rerun waits the same times.
The wrapped env's step runs first; the wait is spent in ``await asyncio.sleep`` (other
episodes and the learner run meanwhile), and only after a step that made a tool call
(its info has a receipt).
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

from taurl import envs
from taurl.envs.core import Env, Task


class ToolLatency:
    """`env` with every tool call delayed (module docstring); everything else forwarded."""

    def __init__(self, env: Env, mean_s: float = 0.2, sigma: float = 1.0, max_s: float = 5.0):
        self.env, self.mean_s, self.sigma, self.max_s = env, mean_s, sigma, max_s
        self._rng = random.Random(0)
        self.waited_s = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def delay(self) -> float:
        if self.mean_s <= 0:
            return 0.0
        mu = math.log(self.mean_s) - self.sigma ** 2 / 2
        return min(self.max_s, self._rng.lognormvariate(mu, self.sigma))

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self._rng = random.Random(f"latency:{seed}")
        return self.env.reset(task, seed)

    def step(self, action: str):  # the synchronous step has no latency to hide; it is the same step
        return self.env.step(action)

    async def astep(self, action: str):
        astep = getattr(self.env, "astep", None)
        out = await astep(action) if astep else self.env.step(action)
        if out[4].get("receipt") is not None:
            d = self.delay()
            self.waited_s += d
            await asyncio.sleep(d)
        return out


def register_latency_env(name: str = "search-latency-v0", base: str = "search-v0") -> str:
    """Register `name`: `base` with `ToolLatency` (env options latency_mean_s, latency_sigma,
    latency_max_s; the rest go to `base`), sharing its tasks, expert, verifier and policy hooks."""
    if name in envs.registered():
        return name
    spec = envs.spec(base)

    def factory(latency_mean_s: float = 0.2, latency_sigma: float = 1.0, latency_max_s: float = 5.0,
                **options: Any) -> ToolLatency:
        return ToolLatency(envs.make(base, **options), latency_mean_s, latency_sigma, latency_max_s)

    envs.register(name, factory, tasks=spec.tasks, expert=spec.expert, verifier=spec.verifier,
                  policy_hooks=spec.policy_hooks)
    return name
