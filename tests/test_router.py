"""`EngineRouter`: an episode sticks to one engine, episodes spread over the engines, and a
weight load moves every engine to the new version or stops the update with the reason."""

from __future__ import annotations

import asyncio

import pytest

from taurl import envs
from taurl.data.trajectory import validate_trajectory
from taurl.envs.search import generate_tasks
from taurl.errors import EngineError
from taurl.policy.engine import LocalEngine, make_engine
from taurl.policy.files import save_policy
from taurl.policy.model import build_default_policy, load_policy
from taurl.policy.router import EngineRouter, routing_key
from taurl.rollout.loop import RolloutConfig, run_episodes


class Recording:
    """A real engine that notes which episode (routing key) each of its calls served."""

    def __init__(self, inner):
        self.inner, self.keys = inner, []

    version = property(lambda self: self.inner.version)
    max_context = property(lambda self: self.inner.max_context)

    async def generate(self, prompt_ids, sampling):
        self.keys.append(routing_key.get())
        return await self.inner.generate(prompt_ids, sampling)

    async def load_weights(self, path, version):
        await self.inner.load_weights(path, version)

    async def pause(self, mode="wait"):
        await self.inner.pause(mode)

    async def resume(self):
        await self.inner.resume()

    async def health(self):
        return await self.inner.health()

    def close(self):
        self.inner.close()


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("router")
    tasks = generate_tasks("train", n=50, seed=0)
    model, tok = build_default_policy(
        [t.prompt for t in tasks] + [envs.make("search-v0").system_prompt] * 5, path / "v0",
        size="tiny", seed=0,
    )
    save_policy(model, tok, path / "v0", {"policy_version": 0})
    return path / "v0"


def test_episodes_stick_to_one_engine_and_spread_over_all(policy):
    engines = [
        Recording(LocalEngine(load_policy(policy)[0], load_policy(policy)[1], version=0, seed=i))
        for i in range(2)
    ]
    router = EngineRouter(engines)
    tok = load_policy(policy)[1]
    tasks = generate_tasks("train", n=8, seed=3)
    result = asyncio.run(
        run_episodes(
            router, lambda: envs.make("search-v0"), tok, tasks, group_size=2,
            config=RolloutConfig(max_action_tokens=16, max_turns=3), concurrency=4, seed=1,
        )
    )
    assert not result.failures and len(result.trajectories) == 16
    for t in result.trajectories:
        validate_trajectory(t)
    by_engine = [set(e.keys) for e in engines]
    assert not by_engine[0] & by_engine[1], "an episode's turns went to two engines"
    assert all(len(keys) >= 4 for keys in by_engine), (
        f"episodes per engine: {[len(k) for k in by_engine]}"
    )
    assert sum(len(e.keys) for e in engines) == sum(len(t.turns) for t in result.trajectories)


def test_weight_load_moves_every_engine_or_stops_with_the_reason(policy, tmp_path):
    model, tok = load_policy(policy)
    save_policy(model, tok, tmp_path / "v1", {"policy_version": 1})
    router = make_engine("local", policy, tok, version=0, replicas=2)
    assert isinstance(router, EngineRouter) and len(router.engines) == 2
    asyncio.run(router.load_weights(tmp_path / "v1", 1))
    assert router.version == 1 and {e.version for e in router.engines} == {1}

    class Broken(Recording):
        async def load_weights(self, path, version):
            raise EngineError("server went away")

    mixed = EngineRouter([router.engines[0], Broken(router.engines[1])])
    with pytest.raises(
        EngineError, match="1 of 2 engines failed to load version 2.*server went away"
    ):
        asyncio.run(mixed.load_weights(tmp_path / "v1", 2))


def test_engines_on_different_versions_are_refused(policy):
    model, tok = load_policy(policy)
    with pytest.raises(EngineError, match="different policy versions"):
        EngineRouter([LocalEngine(model, tok, version=0), LocalEngine(model, tok, version=1)])
    with pytest.raises(EngineError, match="replicas must be an integer"):
        make_engine("local", policy, tok, version=0, replicas=0)
