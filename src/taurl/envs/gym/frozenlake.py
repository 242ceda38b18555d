"""frozenlake-v0: Gymnasium's FrozenLake-v1 on random maps, one map per task.

Each task is a map drawn with Gymnasium's ``generate_random_map(size, p_frozen, seed)``
(every drawn map has a path from S to G) and the task's split is decided by the map's
content (`taurl.envs.gym.splits`): a holdout map is never a training or validation map,
whatever seed drew it. Validation and holdout maps are distinct within one `frozenlake_tasks`
call (each map is one cluster of the evaluation's interval); training maps may repeat.

The prompt shows the map (one row a line, cells separated by spaces so that each cell is
its own token) and the start; after each move the env answers inline with the position and
the four neighbouring cells, e.g. ``<information>row 1 col 2. left F down H right F up
F</information>`` ("wall" past the edge). Moves: ``<action>left|down|right|up</action>``.
Reward: 1.0 for reaching G, 0.0 otherwise (a hole, or the turn budget running out).

``slippery=True`` uses Gymnasium's slippery ice (the intended move with probability 1/3,
each perpendicular one 1/3), seeded by the episode seed. The expert then still plays the
shortest path of the non-slippery map, open loop (it cannot see where it slid), so its
demonstrations are far from optimal there; use slippery maps for evaluation of robustness,
not for SFT demonstrations.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

from taurl.envs.core import Task
from taurl.envs.gym.adapter import GymTextEnv
from taurl.envs.gym.solve import ReplayVerifier, Table, tabular_expert
from taurl.envs.gym.splits import content_hash, derive_seed, draw
from taurl.errors import ConfigError

NAME = "frozenlake-v0"
VERSION = "1"
SIZES = (4, 8, 12, 16)  # 12 and 16: longer horizons (22 and 30 moves on the shortest path)
FRACTIONS = (0.8, 0.1, 0.1)  # train / validation / holdout share of the map space
ACTIONS = ("left", "down", "right", "up")  # Gymnasium's action ids 0..3
SYSTEM_PROMPT = (
    "Walk from S to G on the frozen lake. F is ice, H is a hole: stepping into a hole ends the "
    "walk. Move with <action>left</action>, <action>down</action>, <action>right</action> or "
    "<action>up</action>."
)


def map_key(rows: list[str]) -> str:
    return "/".join(rows)


def prompt_of(rows: list[str]) -> str:
    grid = "\n".join(" ".join(r) for r in rows)
    return (f"Map ({len(rows)}x{len(rows)}):\n{grid}\n"
            f"<information>{describe_cell(rows, 0, 0)}</information>")


def describe_cell(rows: list[str], r: int, c: int) -> str:
    """``row r col c. left X down X right X up X`` (X a cell letter or "wall"; no commas:
    each costs a token in every observation)."""
    n_r, n_c = len(rows), len(rows[0])

    def at(rr: int, cc: int) -> str:
        return rows[rr][cc] if 0 <= rr < n_r and 0 <= cc < n_c else "wall"

    return (f"row {r} col {c}. left {at(r, c - 1)} down {at(r + 1, c)} right {at(r, c + 1)} up "
            f"{at(r - 1, c)}")


def frozenlake_tasks(split: str, n: int, seed: int = 0, size: int = 4, slippery: bool = False,
                     p_frozen: float = 0.8) -> list[Task]:
    """`n` tasks of `split` ("train" | "validation" | "holdout"): random `size` x `size` maps
    (4, 8, 12 or 16), each cell frozen with probability `p_frozen`, deterministic in `seed`."""
    problems = []
    if size not in SIZES:
        problems.append(f"size must be one of {SIZES}, got {size!r}")
    if not isinstance(slippery, bool):
        problems.append(f"slippery must be true or false, got {slippery!r}")
    if isinstance(p_frozen, bool) or not isinstance(p_frozen,
                                                    (int, float)) or not 0.5 <= p_frozen <= 1.0:
        problems.append("p_frozen must be a number in [0.5, 1] (Gymnasium's default is 0.8), got "
                        f"{p_frozen!r}")
    if problems:
        raise ConfigError(problems)

    def candidates() -> Iterator[tuple[int, list[str]]]:
        for i in range(10**9):
            map_seed = derive_seed("frozenlake", size, p_frozen, seed, i)
            yield map_seed, generate_random_map(size=size, p=p_frozen, seed=map_seed)

    drawn = draw(split, n, candidates(), map_key, FRACTIONS, distinct=split != "train",
                 max_draws=max(1000, 200 * n), what=f"{size}x{size} maps")
    return [Task(task_id=f"frozenlake{size}-{split}-s{seed}-{i}", prompt=prompt_of(rows),
                 answers=(), split=split, env=NAME,
                 metadata={"map": rows, "size": size, "slippery": slippery, "map_seed": map_seed,
                                     "map_hash": content_hash(map_key(rows))})
            for i, (map_seed, rows) in enumerate(drawn)]


def map_of(task: Task) -> list[str]:
    """The task's map rows, checked (a JSONL task may bring its own)."""
    rows = task.metadata.get("map")
    fix = 'give metadata {"map": ["SFFF", "FHFH", "FFFH", "HFFG"]}: equal-length rows of S, F, H, G'
    if not isinstance(rows, list) or not rows or not all(isinstance(r, str) and r for r in rows):
        raise ConfigError(f"task {task.task_id!r} has no map; {fix}")
    text = "".join(rows)
    if (len({len(r) for r in rows}) != 1 or set(text) - set("SFHG") or text.count("S") != 1
        or text.count("G") < 1):
        raise ConfigError(f"task {task.task_id!r}: malformed map {rows!r}; {fix} (one S)")
    return rows


class FrozenLake:
    """The `GymGame` (and `TabularGame`) of FrozenLake-v1 on the task's map."""

    name = NAME
    version = VERSION
    action_names = ACTIONS
    system_prompt = SYSTEM_PROMPT
    stop_reasons = ("goal", "hole")

    def make(self, task: Task, max_episode_steps: int | None) -> gymnasium.Env:
        return gymnasium.make("FrozenLake-v1", desc=map_of(task),
                              is_slippery=bool(task.metadata.get("slippery", False)),
                              max_episode_steps=max_episode_steps)

    def start(self, env: gymnasium.Env, task: Task, seed: int | None) -> Any:
        return env.reset(seed=seed)[0]

    def world(self, task: Task) -> dict[str, Any]:
        return {k: task.metadata.get(k) for k in ("map_seed", "map_hash", "size", "slippery")}

    def describe(self, env: gymnasium.Env, obs: Any) -> str:
        lake = env.unwrapped
        rows = [bytes(r).decode() for r in lake.desc]
        return describe_cell(rows, *divmod(int(obs), lake.ncol))

    def is_success(self, env: gymnasium.Env, obs: Any) -> bool:
        lake = env.unwrapped
        return bytes(lake.desc.ravel()[int(obs)]) == b"G"

    def planning_model(self, task: Task) -> tuple[Table, int, Callable[[int], bool]]:
        cells = "".join(map_of(task))
        goals = {i for i, ch in enumerate(cells) if ch == "G"}
        return FrozenLakeEnv(desc=map_of(task),
                             is_slippery=False).P, cells.index("S"), goals.__contains__


def frozenlake_env(max_turns: int = 16, max_episode_steps: int | None = None) -> GymTextEnv:
    """The frozenlake-v0 text env; `max_turns` counts every turn, invalid ones included."""
    return GymTextEnv(FrozenLake(), max_turns=max_turns, max_episode_steps=max_episode_steps)


def frozenlake_expert(task: Task, rng: random.Random, p_random: float = 0.0,
                      max_moves: int = 64) -> list[str]:
    """The shortest-path expert (`taurl.envs.gym.solve.expert_moves`); `p_random` degrades it."""
    return tabular_expert(FrozenLake(), task, rng, p_random=p_random, max_moves=max_moves)


def frozenlake_verifier() -> ReplayVerifier:
    return ReplayVerifier(FrozenLake())
