"""The Gymnasium adapter and its two envs: frozenlake-v0 and taxi-v0."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from taurl import envs
from taurl.envs.gym import (
    GymTextEnv,
    expert_moves,
    frozenlake_expert,
    frozenlake_tasks,
    goal_distances,
    parse_action,
    taxi_expert,
    taxi_tasks,
)
from taurl.envs.gym.frozenlake import FrozenLake, map_key
from taurl.envs.gym.splits import split_of
from taurl.envs.gym.taxi import START_STATES, state_key
from taurl.errors import ConfigError, EnvCheckError
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.synth import ScriptedEngine

ENVS = {"frozenlake-v0": frozenlake_expert, "taxi-v0": taxi_expert}


def _task(rows: list[str], slippery: bool = False) -> envs.Task:
    return envs.Task(task_id="t", prompt="", answers=(), split="train", env="frozenlake-v0",
                     metadata={"map": rows, "slippery": slippery})


def _play(env: GymTextEnv, task: envs.Task, actions: list[str], seed: int = 0):
    """Step `env` through `actions`; returns the last step's (obs, reward, terminated,
    truncated, info)."""
    env.reset(task, seed)
    for a in actions:
        out = env.step(a)
        if out[2] or out[3]:
            return out
    return out


@pytest.fixture(scope="module")
def tokenizer():
    from taurl.policy import build_tokenizer

    texts = []
    for name, expert in ENVS.items():
        tasks = envs.make_tasks(name, "train", 50)
        texts += [t.prompt for t in tasks] + [a for t in tasks for a in expert(t, random.Random(0))]
        texts.append(envs.make(name).system_prompt)
    return build_tokenizer(texts, vocab_size=600)


# -- the protocol ------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ENVS))
def test_check_env_passes(name):
    task = envs.make_tasks(name, "validation", 1)[0]
    envs.check_env(envs.make(name, max_turns=30), task, actions=ENVS[name](task, random.Random(0)))
    envs.check_env(envs.make(name), task)  # default actions: all invalid, truncated by max_turns


def test_check_env_catches_a_broken_game():
    class NoStop(FrozenLake):
        stop_reasons = ("max_turns", "hole")  # a loop truncation reason on a termination

    task = frozenlake_tasks("train", 1)[0]
    with pytest.raises(EnvCheckError, match="stop_reason"):
        envs.check_env(
            GymTextEnv(NoStop()), task, actions=frozenlake_expert(task, random.Random(0))
        )


def test_parse_action():
    names = ("left", "down", "right", "up")
    assert parse_action("<action>up</action>", names) == {"kind": "move", "name": "up", "id": 3}
    assert parse_action("<action>left</action> then <action> Right </action>", names)["id"] == 2
    assert parse_action("<action>jump</action>", names)["kind"] == "invalid"
    assert parse_action("right", names) == {"kind": "invalid"}


def test_provenance_names_the_map():
    task = frozenlake_tasks("train", 1, seed=3)[0]
    _, info = envs.make("frozenlake-v0").reset(task, 0)
    assert info["provenance"] == {
        "map_seed": task.metadata["map_seed"],
        "map_hash": task.metadata["map_hash"],
        "size": 4,
        "slippery": False,
    }


# -- experts -----------------------------------------------------------------------------

def test_goal_distances_by_hand():
    # S F      d = 2 1      the hole H has no distance; G is 0
    # H G          ∞ 0
    P, start, goal = FrozenLake().planning_model(_task(["SF", "HG"]))
    d = goal_distances(P, goal)
    assert d == {0: 2, 1: 1, 2: float("inf"), 3: 0}
    assert expert_moves(P, start, goal, random.Random(0)) == [2, 1]  # right, down (down would fall)


@pytest.mark.parametrize(
    "name,n,options",
    [("frozenlake-v0", 200, {}), ("frozenlake-v0", 40, {"size": 8}), ("taxi-v0", 200, {})],
)
def test_expert_solves_every_task(name, n, options):
    tasks = envs.make_tasks(name, "train", n, **options) + envs.make_tasks(
        name, "holdout", 20, **options
    )
    for t in tasks:
        actions = ENVS[name](t, random.Random(0))
        _, reward, terminated, truncated, info = _play(envs.make(name, max_turns=64), t, actions)
        assert (reward, terminated, truncated) == (1.0, True, False), (t.task_id, actions)
        assert info["stop_reason"] in ("goal", "delivered")


def test_expert_is_shortest_on_an_open_map():
    rows = ["SFFF", "FFFF", "FFFF", "FFFG"]
    assert len(frozenlake_expert(_task(rows), random.Random(0))) == 6  # Manhattan distance


@pytest.mark.parametrize("name", sorted(ENVS))
def test_degraded_expert_is_worse(name):
    tasks = envs.make_tasks(name, "train", 100)
    budget = 16 if name == "frozenlake-v0" else 24

    def success(p_random: float) -> float:
        rng = random.Random(0)
        wins = [
            _play(envs.make(name, max_turns=budget), t, ENVS[name](t, rng, p_random=p_random))[1]
            for t in tasks
        ]
        return sum(wins) / len(wins)

    perfect, degraded = success(0.0), success(0.3)
    assert perfect == 1.0
    assert degraded < 0.9, degraded
    assert success(1.0) < degraded


def test_p_random_is_checked():
    with pytest.raises(ConfigError, match="p_random"):
        frozenlake_expert(frozenlake_tasks("train", 1)[0], random.Random(0), p_random=1.5)


# -- through the real loop, and the verifier -----------------------------------------------

def _episode(name: str, task, tokenizer, actions, seed=0):
    config = RolloutConfig(
        max_turns=64, max_action_tokens=16, max_episode_tokens=2048, max_context=8192
    )
    return asyncio.run(
        run_episode(
            ScriptedEngine(tokenizer, actions, max_context=8192), envs.make(name, max_turns=64),
            tokenizer, task, seed=seed, config=config,
        )
    )


@pytest.mark.parametrize("name", sorted(ENVS))
def test_verifier_agrees_with_the_loop_and_rejects_tampering(name, tokenizer):
    verifier = envs.spec(name).make_verifier()
    assert verifier.version
    rng = random.Random(1)
    agree = 0
    tasks = envs.make_tasks(name, "validation", 12)
    for i, task in enumerate(tasks):
        actions = ENVS[name](task, rng, p_random=0.0 if i % 2 == 0 else 0.5)
        traj = _episode(name, task, tokenizer, actions)
        if i % 2 == 0:
            assert traj.reward == 1.0 and traj.terminated, (task.task_id, traj.stop_reason)
        agree += verifier(traj, task) == traj.reward
        if traj.reward == 1.0:
            # the last move dropped: the record no longer reaches the goal
            assert verifier(dataclasses.replace(traj, turns=traj.turns[:-1]), task) == 0.0
            # every move rewritten to the first action name, reward still claimed as 1.0
            names = envs.make(name).game.action_names
            forged = tuple(
                dataclasses.replace(t, action_text=f"<action>{names[1]}</action>")
                for t in traj.turns
            )
            assert verifier(dataclasses.replace(traj, turns=forged), task) == 0.0
    assert agree == len(tasks)


def test_verifier_replays_slippery_ice_with_the_episode_seed(tokenizer):
    verifier = envs.spec("frozenlake-v0").make_verifier()
    tasks = frozenlake_tasks("validation", 30, slippery=True)
    rewards = []
    for i, task in enumerate(tasks):
        traj = _episode(
            "frozenlake-v0", task, tokenizer, frozenlake_expert(task, random.Random(i)) * 4, seed=i
        )
        rewards.append(traj.reward)
        assert verifier(traj, task) == traj.reward, task.task_id
    assert 0 < sum(rewards) < len(rewards)  # the ice slips: some reach the goal, some do not


# -- episode rules -------------------------------------------------------------------------

def test_invalid_actions_are_counted_and_cost_a_turn():
    task = _task(["SFFF", "FFFF", "FFFF", "FFFG"])
    env = envs.make("frozenlake-v0", max_turns=3)
    env.reset(task, 0)
    obs, reward, terminated, truncated, info = env.step("go right")
    assert info["invalid"] and info["action"]["kind"] == "invalid"
    assert "invalid action" in obs and "row 0 col 0" in obs  # the state did not change
    assert not (terminated or truncated)
    env.step("<action>right</action>")
    obs, _, terminated, truncated, info = env.step("<action>fly</action>")
    assert info["invalid"] and truncated and not terminated and info["stop_reason"] == "max_turns"


def test_terminated_vs_truncated():
    rows = ["SH", "FG"]
    # a hole is a terminal state (Gymnasium: terminated), reward 0
    _, r, term, trunc, info = _play(
        envs.make("frozenlake-v0"), _task(rows), ["<action>right</action>"]
    )
    assert (r, term, trunc, info["stop_reason"]) == (0.0, True, False, "hole")
    # the goal: terminated, reward 1
    _, r, term, trunc, info = _play(
        envs.make("frozenlake-v0"), _task(rows), ["<action>down</action>", "<action>right</action>"]
    )
    assert (r, term, trunc, info["stop_reason"], info["reward_components"]) == (
        1.0, True, False, "goal", {"outcome": 1.0},
    )
    # Gymnasium's TimeLimit (2 valid moves; bumping the wall) truncates, invalid turns
    # do not count toward it
    env = envs.make("frozenlake-v0", max_turns=10, max_episode_steps=2)
    env.reset(_task(rows), 0)
    assert not any(env.step(a)[3] for a in ("<action>up</action>", "oops"))
    _, r, term, trunc, info = env.step("<action>left</action>")
    assert (r, term, trunc, info["stop_reason"]) == (0.0, False, True, "max_turns")
    # a goal reached on the last allowed turn is a termination, not a truncation
    env = envs.make("frozenlake-v0", max_turns=2)
    _, r, term, trunc, _ = _play(
        env, _task(rows), ["<action>down</action>", "<action>right</action>"]
    )
    assert (r, term, trunc) == (1.0, True, False)


def test_malformed_task_map_says_how_to_fix_it():
    with pytest.raises(ConfigError, match="equal-length rows"):
        envs.make("frozenlake-v0").reset(_task(["SFX", "FFG"]), 0)
    with pytest.raises(ConfigError, match="size must be one of"):
        frozenlake_tasks("train", 1, size=5)
    with pytest.raises(ConfigError, match="max_turns"):
        envs.make("taxi-v0", max_turns=0)


# -- splits --------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [4, 8])
def test_frozenlake_holdout_maps_never_in_train_or_validation(size):
    maps = {
        split: [tuple(t.metadata["map"]) for t in frozenlake_tasks(split, n, seed=seed, size=size)]
        for split, n, seed in (("train", 1500, 0), ("validation", 100, 0), ("holdout", 100, 0))
    }
    more_train = {
        tuple(t.metadata["map"]) for t in frozenlake_tasks("train", 500, seed=7, size=size)
    }
    holdout = set(maps["holdout"])
    assert len(holdout) == 100  # evaluation maps are distinct
    assert not holdout & (set(maps["train"]) | more_train), "a holdout map reached training"
    assert not holdout & set(maps["validation"]), "a holdout map reached validation"
    assert not set(maps["validation"]) & (set(maps["train"]) | more_train)
    # the rule is the content: the same map is in the same split, whatever seed drew it
    assert all(split_of(map_key(list(m)), (0.8, 0.1, 0.1)) == "holdout" for m in holdout)
    assert len(set(maps["train"])) > 100  # and training sees many maps


def test_taxi_holdout_starts_never_in_train_or_validation():
    starts = {s: {tuple(t.metadata["start"]) for t in taxi_tasks(s, n)} for s, n in
              (("train", 3000), ("validation", 40), ("holdout", 40))}
    assert len(starts["holdout"]) == 40
    assert not starts["holdout"] & (starts["train"] | starts["validation"])
    assert not starts["validation"] & starts["train"]
    assert sum(map(len, starts.values())) <= len(START_STATES)
    assert all(split_of(state_key(s), (0.7, 0.15, 0.15)) == "holdout" for s in starts["holdout"])
    with pytest.raises(ConfigError, match="distinct taxi start states"):
        taxi_tasks("holdout", 200)


def test_tasks_are_deterministic_in_seed():
    a, b, c = (frozenlake_tasks("train", 20, seed=s) for s in (0, 0, 1))
    assert [t.metadata["map"] for t in a] == [t.metadata["map"] for t in b]
    assert [t.metadata["map"] for t in a] != [t.metadata["map"] for t in c]
