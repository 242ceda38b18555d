"""Experts and verifiers for tabular (toy-text) Gymnasium games, over their transition table.

Gymnasium's toy-text envs expose their model as ``env.unwrapped.P``:
``P[s][a] = [(prob, next_state, reward, terminated), ...]``. On a deterministic table (one
entry per (s, a): FrozenLake with ``is_slippery=False``, Taxi with ``is_rainy=False``):

* `goal_distances`: d(s) = the fewest moves from s to a success state, by breadth-first
  search backwards from the success states (Moore 1959; every move costs 1), ∞ when no
  path exists (a hole, a cut-off cell);
* `expert_moves`: the optimal policy plays, at s, the first action (in action-id order)
  with d(next) = d(s) − 1, so the demonstrated policy is a fixed function of the state
  (one answer per state is easier to imitate than a random tie-break). Its quality knob
  `p_random`: on each turn, with that probability, it plays instead a uniformly drawn
  *suboptimal* action (d(next) ≠ d(s) − 1: a detour, a bump into a wall, a step into a
  hole, an illegal pickup) and then goes on optimally from wherever it landed. SFT on such
  demonstrations learns the protocol and the greedy route but also a habit of random
  mistakes, some fatal (a hole) or costly (the turn budget runs out); RL can unlearn them;
* `ReplayVerifier`: the evaluator's verifier re-plays the moves parsed from the recorded
  action texts on a fresh Gymnasium env of the task (same episode seed, so slippery
  transitions repeat) and checks that the last recorded turn lands in a success state.
  It never reads the training reward.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from taurl.envs.core import Task
from taurl.envs.gym.adapter import GymGame, action_text, parse_action
from taurl.errors import ConfigError

Table = Mapping[int, Mapping[int, Sequence[tuple[float, int, float, bool]]]]
INF = float("inf")


class TabularGame(GymGame, Protocol):
    """A `GymGame` whose planning model is a deterministic transition table."""

    def planning_model(self, task: Task) -> tuple[Table, int, Callable[[int], bool]]:
        """(the deterministic table P of the task's world, the task's start state, which
        states are a success)."""
        ...


def goal_distances(P: Table, is_success: Callable[[int], bool]) -> dict[int, float]:
    """d(s): fewest moves from s to a success state (backward BFS; ∞ if unreachable).
    Transitions out of a terminal move (into a hole) are not followed."""
    reverse: dict[int, set[int]] = {s: set() for s in P}
    for s, moves in P.items():
        for outcomes in moves.values():
            if len(outcomes) != 1:
                raise ConfigError("goal_distances needs a deterministic table (one outcome per "
                                  "move); plan on the non-slippery world")
            _, s2, _, terminated = outcomes[0]
            if s2 != s and not (terminated and not is_success(s2)):
                reverse.setdefault(s2, set()).add(s)
    d: dict[int, float] = {s: INF for s in P}
    queue = deque(s for s in P if is_success(s))
    for s in queue:
        d[s] = 0
    while queue:
        s = queue.popleft()
        for prev in reverse.get(s, ()):
            if d[prev] == INF and not is_success(prev):
                d[prev] = d[s] + 1
                queue.append(prev)
    return d


def expert_moves(P: Table, start: int, is_success: Callable[[int], bool], rng: random.Random, *,
                 p_random: float = 0.0, max_moves: int = 64) -> list[int]:
    """The (degraded) optimal move ids from `start` until success, a failed terminal state
    or `max_moves` (module docstring)."""
    if not 0.0 <= p_random <= 1.0:
        raise ConfigError(f"p_random must be a probability in [0, 1], got {p_random!r}")
    d = goal_distances(P, is_success)
    if d.get(start, INF) == INF:
        raise ConfigError(f"no path from the start state {start} to a success state; the task "
                          "cannot be solved")
    s, moves = start, []
    while len(moves) < max_moves and not is_success(s):
        nexts = {a: P[s][a][0] for a in sorted(P[s])}
        best = [a for a, (_, s2, _, _) in nexts.items() if d.get(s2, INF) == d[s] - 1]
        worse = [a for a in nexts if a not in best]
        a = rng.choice(worse) if worse and rng.random() < p_random else best[0]
        moves.append(a)
        _, s, _, terminated = nexts[a]
        if terminated and not is_success(s):
            break  # fell into a hole: the episode is over
        if d.get(s, INF) == INF:
            break  # no way back to the goal (cannot happen on toy-text maps, but never loop)
    return moves


def tabular_expert(game: TabularGame, task: Task, rng: random.Random, *, p_random: float = 0.0,
                   max_moves: int = 64) -> list[str]:
    """The expert's action texts for `task`, one per turn (see `expert_moves`)."""
    P, start, is_success = game.planning_model(task)
    moves = expert_moves(P, start, is_success, rng, p_random=p_random, max_moves=max_moves)
    return [action_text(game.action_names[a]) for a in moves]


class ReplayVerifier:
    """Success re-derived from the record: replay the recorded actions (module docstring)."""

    def __init__(self, game: GymGame):
        self.game = game
        self.version = f"{game.name}:{game.version}:replay1"

    def __call__(self, traj: Any, task: Task) -> float:
        env = self.game.make(task, None)
        try:
            obs = self.game.start(env, task, traj.seed)
            turns = list(traj.turns)
            for i, turn in enumerate(turns):
                parsed = parse_action(turn.action_text, self.game.action_names)
                if parsed["kind"] != "move":
                    continue
                obs, _, terminated, _, _ = env.step(parsed["id"])
                if terminated:  # the record must end here, in a success state
                    return 1.0 if i == len(turns) - 1 and self.game.is_success(env, obs) else 0.0
            return 0.0
        finally:
            env.close()
