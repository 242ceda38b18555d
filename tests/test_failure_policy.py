"""One failure policy for every collector (`taurl.rollout.runner`): a round in which no episode
produced a record stops the run with its first cause — in process (tests/test_faults.py),
in the async schedule (tests/test_async_schedule.py), on Ray workers and for agents through
the proxy (here). Before, the Ray collector and the proxy's returned an empty batch, which
the learner skipped without a word."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from taurl import envs
from taurl.data.ledger import Ledger
from taurl.envs.search import generate_tasks
from taurl.policy.files import save_policy
from taurl.policy.model import build_default_policy
from taurl.rollout.episodes import EpisodeError, EpisodeSpec
from taurl.rollout.loop import RolloutConfig


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    texts = [t.prompt for t in generate_tasks("train", n=200, seed=0)] + [
        envs.make("search-v0").system_prompt
    ]
    path = tmp_path_factory.mktemp("p")
    model, tok = build_default_policy(texts, path / "tmp", size="tiny", seed=0)
    save_policy(model, tok, path / "v0", {"policy_version": 0})
    return SimpleNamespace(model=model, tok=tok, path=path / "v0")


def _specs(n: int) -> list[EpisodeSpec]:
    return [
        EpisodeSpec(f"e{i}", t, i, f"g{i // 2}")
        for i, t in enumerate(generate_tasks("train", n=n, seed=3))
    ]


def test_an_agent_round_where_no_episode_gives_a_record_stops_with_the_first_cause(
    policy, tmp_path
):
    pytest.importorskip("starlette")
    from taurl.policy.engine import LocalEngine
    from taurl.proxy.collect import collect_agent

    agent = {
        "command": [sys.executable, "-c", "import sys; print('no model for me'); sys.exit(2)"],
        "timeout_s": 20,
    }
    engine = LocalEngine(policy.model, policy.tok, version=0, seed=0)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        with pytest.raises(
            EpisodeError, match=r"every one of the 4 agent episode\(s\) failed.*the first: e\d: "
        ):
            asyncio.run(
                collect_agent(
                    engine, policy.tok, lambda: envs.make("search-v0"), _specs(4), agent=agent,
                    config=RolloutConfig(max_action_tokens=8), ledger=ledger, run_id="t",
                )
            )
        assert len(ledger) == 0


@pytest.mark.timeout(300)
def test_a_ray_round_where_no_episode_gives_a_record_stops_with_the_first_cause(policy, tmp_path):
    """Every worker's env fails to build (an option the env does not take)."""
    pytest.importorskip(
        "ray", reason="ray is not installed: pip install 'taurl[ray]' (it is in the dev extras)"
    )
    from taurl.recipe.config import TrainConfig
    from taurl.scale.ray_backend import RayCollector

    cfg = TrainConfig(
        env_config={"no_such_option": 1}, backend="ray", backend_options={"workers": 1},
        concurrency=4, max_turns=1, max_action_tokens=4, max_episode_tokens=4,
    )
    r = SimpleNamespace(
        cfg=cfg, run=SimpleNamespace(root=Path(tmp_path / "run")), hook=lambda name, info: None
    )
    collector = RayCollector.start(r, policy.path, 0, seed=0)
    try:
        with Ledger(tmp_path / "l.sqlite") as ledger:
            with pytest.raises(
                EpisodeError,
                match=r"every one of the 4 episode\(s\) failed.*the first: e\d: .*no_such_option",
            ):
                collector.collect(_specs(4), ledger=ledger)
            assert len(ledger) == 0
    finally:
        collector.close()
