"""taxi-v0: Gymnasium's Taxi-v4 (Dietterich 2000), one start state per task.

The 5x5 grid and its walls are fixed; a task is a start state: the taxi's cell, the
passenger's pad (R, G, Y or B) and the destination pad (another one) — 300 start states.
The split of a start state is decided by its content (`taurl.envs.gym.splits`, 70/15/15),
so ~45 start states are holdout-only; validation and holdout tasks are distinct within a
call, training tasks cycle through the training states.

The prompt shows the map and the state; after each move the env answers inline, e.g.
``<information>taxi row 2 col 1. passenger at Y row 4 col 0. destination G row 0 col 4
</information>`` ("passenger in taxi" once picked up). Moves:
``<action>south|north|east|west|pickup|dropoff</action>``. Reward: 1.0 when the passenger is
dropped off at the destination, else 0.0 (Gymnasium's −1/step and −10/illegal shaping is
kept in ``info["gym_reward"]`` only). ``rainy=True`` uses Gymnasium's rainy roads (the
intended move with probability 0.8); the expert then plays the dry plan open loop.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
from gymnasium.envs.toy_text.taxi import MAP, TaxiEnv
from gymnasium.wrappers import TimeLimit

from taurl.envs.core import Task
from taurl.envs.gym.adapter import GymTextEnv
from taurl.envs.gym.solve import ReplayVerifier, Table, tabular_expert
from taurl.envs.gym.splits import content_hash, derive_seed, draw
from taurl.errors import ConfigError

NAME = "taxi-v0"
VERSION = "1"
FRACTIONS = (0.7, 0.15, 0.15)
TIME_LIMIT = 200  # Taxi-v4's registered max_episode_steps
ACTIONS = ("south", "north", "east", "west", "pickup", "dropoff")  # Gymnasium's ids 0..5
PADS = ("R", "G", "Y", "B")
PAD_CELLS = ((0, 0), (0, 4), (4, 0), (4, 3))  # TaxiEnv.locs
SYSTEM_PROMPT = (
    "Drive the taxi to the passenger, pick them up, drive to the destination and drop them off. "
    "| is a wall. Act with <action>south</action>, north, east, west, pickup or dropoff."
)
START_STATES = tuple((r, c, p, d) for r in range(5) for c in range(5) for p in range(4)
                     for d in range(4) if p != d)


def state_key(start: tuple[int, int, int, int]) -> str:
    return "taxi:" + ",".join(map(str, start))


def describe_state(row: int, col: int, passenger: int, dest: int) -> str:
    where = ("in taxi" if passenger == 4 else f"at {PADS[passenger]} row {PAD_CELLS[passenger][0]} "
                                              f"col {PAD_CELLS[passenger][1]}")
    return (f"taxi row {row} col {col}. passenger {where}. destination {PADS[dest]} row "
            f"{PAD_CELLS[dest][0]} col {PAD_CELLS[dest][1]}")


def prompt_of(start: tuple[int, int, int, int]) -> str:
    return "Map:\n" + "\n".join(MAP) + f"\n<information>{describe_state(*start)}</information>"


def taxi_tasks(split: str, n: int, seed: int = 0, rainy: bool = False) -> list[Task]:
    """`n` tasks of `split` ("train" | "validation" | "holdout"), deterministic in `seed`."""
    if not isinstance(rainy, bool):
        raise ConfigError(f"rainy must be true or false, got {rainy!r}")

    def candidates() -> Iterator[tuple[int, tuple[int, int, int, int]]]:
        for rnd in range(10**9):  # a fresh shuffle of all start states per pass
            order = list(START_STATES)
            random.Random(derive_seed("taxi", seed, rnd)).shuffle(order)
            yield from ((rnd, s) for s in order)

    drawn = draw(split, n, candidates(), state_key, FRACTIONS, distinct=split != "train",
                 max_draws=max(len(START_STATES),
                               2 * n * len(START_STATES) // 100 + len(START_STATES)),
                 what="taxi start states")
    return [Task(task_id=f"taxi-{split}-s{seed}-{i}", prompt=prompt_of(start), answers=(),
                 split=split, env=NAME, metadata={"start": list(start), "rainy": rainy,
                           "state_hash": content_hash(state_key(start))})
            for i, (_, start) in enumerate(drawn)]


def start_of(task: Task) -> tuple[int, int, int, int]:
    start = task.metadata.get("start")
    if not (isinstance(start, list | tuple) and tuple(start) in START_STATES):
        raise ConfigError(f"task {task.task_id!r}: metadata start must be [taxi row, taxi col, "
                          "passenger pad 0-3, destination pad 0-3 (not the passenger's)] with "
                          f"rows/cols 0-4, got {start!r}")
    return tuple(start)  # type: ignore[return-value]


@functools.lru_cache(maxsize=2)
def _template(rainy: bool) -> TaxiEnv:
    return TaxiEnv(is_rainy=rainy)


@functools.lru_cache(maxsize=1)
def _dry_table() -> tuple[TaxiEnv, Table]:
    env = TaxiEnv(is_rainy=False)
    return env, env.P


class Taxi:
    """The `GymGame` (and `TabularGame`) of Taxi-v4 from the task's start state."""

    name = NAME
    version = VERSION
    action_names = ACTIONS
    system_prompt = SYSTEM_PROMPT
    stop_reasons = ("delivered", "terminal")

    def make(self, task: Task, max_episode_steps: int | None) -> gymnasium.Env:
        start_of(task)
        # building TaxiEnv's 500x6 table costs ~30 ms; a shallow copy of a built one shares
        # the (read-only) table and gets its own state and RNG at reset
        env = copy.copy(_template(bool(task.metadata.get("rainy", False))))
        return TimeLimit(env, max_episode_steps or TIME_LIMIT)

    def start(self, env: gymnasium.Env, task: Task, seed: int | None) -> Any:
        env.reset(seed=seed)  # seeds the rain; the start state is the task's, not a random draw
        env.unwrapped.s = env.unwrapped.encode(*start_of(task))
        return int(env.unwrapped.s)

    def world(self, task: Task) -> dict[str, Any]:
        return {"start": list(start_of(task)), "rainy": task.metadata.get("rainy", False),
                "state_hash": task.metadata.get("state_hash")}

    def describe(self, env: gymnasium.Env, obs: Any) -> str:
        return describe_state(*env.unwrapped.decode(int(obs)))

    def is_success(self, env: gymnasium.Env, obs: Any) -> bool:
        _, _, passenger, dest = env.unwrapped.decode(int(obs))
        return passenger == dest

    def planning_model(self, task: Task) -> tuple[Table, int, Callable[[int], bool]]:
        env, P = _dry_table()

        def delivered(s: int) -> bool:
            _, _, passenger, dest = env.decode(s)
            return passenger == dest

        return P, env.encode(*start_of(task)), delivered


def taxi_env(max_turns: int = 24, max_episode_steps: int | None = None) -> GymTextEnv:
    """The taxi-v0 text env; `max_turns` counts every turn, invalid ones included."""
    return GymTextEnv(Taxi(), max_turns=max_turns, max_episode_steps=max_episode_steps)


def taxi_expert(task: Task, rng: random.Random, p_random: float = 0.0,
                max_moves: int = 64) -> list[str]:
    """The shortest-route expert (`taurl.envs.gym.solve.expert_moves`); `p_random` degrades it."""
    return tabular_expert(Taxi(), task, rng, p_random=p_random, max_moves=max_moves)


def taxi_verifier() -> ReplayVerifier:
    return ReplayVerifier(Taxi())
