"""The long-horizon tasks of the credit comparison (issue 14, item 4): FrozenLake at 8x8 and
larger, whose anchor states recur across a group, and search-v0's distractor family, whose
first query decides the outcome."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest

from taurl import envs
from taurl.credit import TurnBatch, compute_advantages
from taurl.credit.gigpo import anchor_groups
from taurl.envs.gym import frozenlake_expert, frozenlake_tasks
from taurl.envs.search import parse_action
from taurl.errors import ConfigError
from taurl.recipe.config import TrainConfig
from taurl.recipe.validate import load_config
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.synth import ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lake_tokenizer():
    from taurl.policy import build_tokenizer

    tasks = frozenlake_tasks("train", 20, size=8)
    texts = [t.prompt for t in tasks] + [
        a for t in tasks for a in frozenlake_expert(t, random.Random(0))
    ]
    return build_tokenizer(texts + [envs.make("frozenlake-v0").system_prompt], vocab_size=400)


def _lake_episode(task, tokenizer, actions, max_turns=24, seed=0):
    config = RolloutConfig(
        max_turns=max_turns, max_action_tokens=16, max_episode_tokens=2048, max_context=8192
    )
    return asyncio.run(
        run_episode(
            ScriptedEngine(tokenizer, actions, max_context=8192),
            envs.make("frozenlake-v0", max_turns=max_turns),
            tokenizer,
            task,
            seed=seed,
            config=config,
        )
    )


# -- FrozenLake 8x8 and larger -------------------------------------------------------------

def test_frozenlake8_config_is_long_horizon():
    cfg = load_config(TrainConfig, path=ROOT / "configs" / "frozenlake8.yaml")
    assert cfg.task_options["size"] == 8 and 10 <= cfg.max_turns <= 30
    # the expert's demonstrations are optimal only without ice
    assert not cfg.task_options["slippery"]


@pytest.mark.parametrize("size,shortest", [(8, 14), (12, 22), (16, 30)])
def test_large_maps_are_deterministic_and_the_expert_solves_them_in_range(size, shortest):
    tasks = frozenlake_tasks("train", 10, seed=3, size=size)
    assert [t.metadata["map"] for t in tasks] == [
        t.metadata["map"] for t in frozenlake_tasks("train", 10, seed=3, size=size)
    ]
    assert tasks != frozenlake_tasks("train", 10, seed=4, size=size)
    env = envs.make("frozenlake-v0", max_turns=30)
    for t in tasks:
        moves = frozenlake_expert(t, random.Random(0))
        # S is at the top left and G at the bottom right: every path is at least 2 (size - 1) moves
        assert len(moves) == shortest and 10 <= len(moves) <= 30, (t.task_id, len(moves))
        env.reset(t, 0)
        for a in moves:
            _, reward, terminated, truncated, _ = env.step(a)
        assert (reward, terminated, truncated) == (1.0, True, False)


def test_frozenlake_size_is_checked():
    with pytest.raises(ConfigError, match="size must be one of"):
        frozenlake_tasks("train", 1, size=10)


def test_anchor_states_recur_across_a_group_on_8x8(lake_tokenizer):
    """A GiGPO group (8 rollouts of one map, each move a random detour with p = 0.3): the
    observation after a move is the cell and its neighbours, so rollouts that stand on the
    same cell share an anchor state however they got there, and the step-level part of
    GiGPO is non-zero."""
    task = frozenlake_tasks("train", 1, seed=5, size=8)[0]
    rng = random.Random(0)
    trajs = [
        dataclasses.replace(
            _lake_episode(task, lake_tokenizer, frozenlake_expert(task, rng, p_random=0.3)),
            group_id="g0",
        )
        for _ in range(8)
    ]
    batch = TurnBatch.from_trajectories(trajs, max_turns=24)
    ids, n_ids = anchor_groups(batch.group, batch.state_hash, batch.turn_mask)
    counts = np.bincount(ids[ids >= 0], minlength=n_ids)
    rows_of = [set(np.nonzero((ids == k).any(axis=1))[0]) for k in range(n_ids)]
    shared = sum(int(counts[k]) for k in range(n_ids) if len(rows_of[k]) > 1)
    real = int(batch.turn_mask.sum())
    assert real >= 8 * 10  # long episodes: >= 10 turns each on average
    assert shared / real > 0.5, (shared, real)  # most turns have an anchor group spanning rollouts
    # ... reached at different turn indices too (a detour shifts the rest of the path)
    assert any(len({int(t) for t in np.nonzero(ids == k)[1]}) > 1 for k in range(n_ids))
    if len(set(batch.scores.tolist())) > 1:
        step = compute_advantages(batch, "gigpo", omega=1.0).advantages - compute_advantages(
            batch, "gigpo", omega=0.0).advantages
        assert np.abs(step[batch.turn_mask]).max() > 0


def test_the_verifier_rejects_wrong_paths_on_8x8(lake_tokenizer):
    verifier = envs.spec("frozenlake-v0").make_verifier()
    task = frozenlake_tasks("holdout", 1, size=8)[0]
    moves = frozenlake_expert(task, random.Random(0))
    good = _lake_episode(task, lake_tokenizer, moves)
    assert good.reward == 1.0 and verifier(good, task) == 1.0
    short = _lake_episode(
        task, lake_tokenizer, moves[:-1] + ["<action>bogus</action>"], max_turns=len(moves)
    )
    assert short.truncated and verifier(short, task) == 0.0
    forged = dataclasses.replace(good, turns=good.turns[:-2])
    assert verifier(forged, task) == 0.0  # the record stops short of G, whatever reward it claims


# -- search-v0: city_distractors_capital ---------------------------------------------------

FAMILY = "city_distractors_capital"


@pytest.fixture(scope="module")
def distractor_tasks(taurl_cache):
    return envs.make_tasks("search-v0", "train", 6, seed=0, families=[FAMILY], distractors=8)


def test_distractor_tasks_are_deterministic_and_clean(distractor_tasks):
    again = envs.make_tasks("search-v0", "train", 6, seed=0, families=[FAMILY], distractors=8)
    assert [t.task_id for t in again] == [t.task_id for t in distractor_tasks]
    assert [t.prompt for t in again] == [t.prompt for t in distractor_tasks]
    for t in distractor_tasks:
        ds = t.metadata["distractors"]
        assert (
            len(ds) == 8
            and t.metadata["subject"] in t.prompt
            and all(d["city"] in t.prompt for d in ds)
        )
        countries = [d["country"] for d in ds]
        assert t.metadata["bridge"] not in countries and len(set(countries)) == 8
        assert not {d["capital"] for d in ds} & set(t.answers)
    # the distractors stay in their split: validation tasks name only validation cities
    val = envs.make_tasks("search-v0", "validation", 3, families=[FAMILY], distractors=4)
    val_cities = {
        t.metadata["subject"]
        for t in envs.make_tasks("search-v0", "validation", None, families=["city_country_capital"])
    }
    assert all(d["city"] in val_cities for t in val for d in t.metadata["distractors"])


def test_distractor_family_is_opt_in_and_checked(taurl_cache):
    from taurl.envs.search import FAMILIES

    # the default family list (and every existing task plan) is unchanged
    assert FAMILY not in FAMILIES
    with pytest.raises(ConfigError, match="distractors must be an integer"):
        envs.make_tasks("search-v0", "train", 1, families=[FAMILY], distractors=0)


def test_the_first_query_decides_and_the_verifier_rejects_the_distractor_chain(distractor_tasks):
    from taurl.envs.search.expert import search_expert

    env = envs.make("search-v0", max_turns=11)
    for p, expected in ((0.0, 1.0), (1.0, 0.0)):
        for t in distractor_tasks[:3]:
            actions = search_expert(t, random.Random(0), p_first_distractor=p)
            # first search, 8 distractor searches, bridge, answer: in [10, 30]
            assert len(actions) == 8 + 3
            env.reset(t, 0)
            for a in actions:
                obs, reward, terminated, truncated, info = env.step(a)
            assert (reward, terminated, truncated) == (expected, True, False), (
                t.task_id,
                p,
                actions[0],
            )
            # both search the same nine cities; only which one came first (and
            # so the bridge) differs
            cities = {parse_action(a)["query"] for a in actions[:9]}
            assert cities == {
                t.metadata["subject"],
                *(d["city"] for d in t.metadata["distractors"]),
            }
    verifier = envs.spec("search-v0").make_verifier()
    t = distractor_tasks[0]
    wrong = search_expert(t, random.Random(0), p_first_distractor=1.0)[-1]
    right = search_expert(t, random.Random(0))[-1]

    @dataclasses.dataclass
    class _Rec:  # the fields SearchVerifier reads
        task_id: str
        turns: tuple
        terminated: bool = True

    @dataclasses.dataclass
    class _Turn:
        action: dict

    def rec(text: str) -> _Rec:
        return _Rec(t.task_id, (_Turn(parse_action(text)),))

    assert verifier(rec(right), t) == 1.0 and verifier(rec(wrong), t) == 0.0
