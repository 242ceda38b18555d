"""A Gymnasium env with a Discrete action space, played as a text env (inline style).

    env = GymTextEnv(FrozenLake(), max_turns=16)
    obs, info = env.reset(task, seed)             # builds the Gymnasium env the task names
    obs, reward, terminated, truncated, info = env.step("<action>right</action>")

What a `GymGame` supplies (the few things that differ between Gymnasium envs): how to build
the Gymnasium env for a task, how to reset it to the task's start, a text rendering of an
observation, the names of the discrete actions, and which observations are a success.

The text protocol, chosen so that a tiny policy trained from scratch can learn it: the
whole episode is one assistant message; the model writes ``<action>NAME</action>`` (the
engine stops at ``</action>``), and the env appends the new state inline as
``<information>TEXT</information>`` (the tags are one token each in taurl's tokenizer).

Episode rules:
* the LAST complete ``<action>…</action>`` in the text counts; a name outside
  `action_names` (any case, surrounding blanks allowed) or no tag at all is **invalid**:
  ``info["invalid"] = True``, the Gymnasium env is not stepped (its state and its own
  step count stay as they were), the observation says so and repeats the state, and the
  turn still counts against `max_turns` — so invalid actions cost the policy its budget
  but never end the episode by themselves;
* `terminated` and `truncated` keep Gymnasium's meaning: the Gymnasium env reached a
  terminal state (a goal, a hole, a delivery) → terminated; Gymnasium's ``TimeLimit``
  (`max_episode_steps` valid moves) or this env's `max_turns` (all turns) ran out →
  truncated (``stop_reason="max_turns"``). Never both: a move that terminates on the last
  turn is a termination;
* reward: the outcome only, 1.0 when the episode terminates in a success state (the game's
  `is_success`), else 0.0, given on the final step (``reward_components={"outcome": r}``).
  Gymnasium's own step reward is kept in ``info["gym_reward"]`` but not trained on: taxi's
  −1/step and −10/illegal-move shaping would dominate a 0/1 outcome.
* a terminated episode names its terminal state in ``stop_reason``: the game's
  ``stop_reasons[0]`` for a success ("goal", "delivered"), ``stop_reasons[1]`` for any
  other terminal state ("hole") — env-own reasons of the open `StopReason` set, whose kind
  is the terminated flag;
* reset reports ``info["provenance"]``, the game's `world` of the task (a map seed and
  hash, a start state), which the loop keeps in the record.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

import gymnasium

from taurl.envs.core import Task
from taurl.errors import ConfigError, ResetNeeded

STOP = "</action>"
_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL)


class GymGame(Protocol):
    """What one Gymnasium env needs to become a text env (module docstring)."""

    name: str  # the taurl env name, ``family-vN``
    version: str  # bump when an observation, the parser or the reward changes meaning
    action_names: tuple[str, ...]  # name of discrete action i (lower case, one word)
    system_prompt: str
    stop_reasons: tuple[str, str]  # snake_case stop reasons of (a success, another terminal state)

    def make(self, task: Task, max_episode_steps: int | None) -> gymnasium.Env:
        """The Gymnasium env for `task` (``gymnasium.make`` keeps its TimeLimit wrapper)."""
        ...

    def start(self, env: gymnasium.Env, task: Task, seed: int | None) -> Any:
        """Reset `env` (with `seed`) to the task's start; returns the first observation."""
        ...

    def world(self, task: Task) -> dict[str, Any]:
        """Provenance of the task's world for the record (a map seed and hash, a start state)."""
        ...

    def describe(self, env: gymnasium.Env, obs: Any) -> str:
        """The observation as text, shown after every move."""
        ...

    def is_success(self, env: gymnasium.Env, obs: Any) -> bool:
        """Is `obs` a success state (the goal reached, the passenger delivered)?"""
        ...


def parse_action(text: str, names: Sequence[str]) -> dict[str, Any]:
    """The last complete ``<action>NAME</action>`` in `text`: {"kind": "move", "name",
    "id"} with `id` the index of NAME in `names`, or {"kind": "invalid"}."""
    matches = list(_ACTION.finditer(text))
    if not matches:
        return {"kind": "invalid"}
    name = matches[-1].group(1).strip().lower()
    if name not in names:
        return {"kind": "invalid", "name": name[:40]}
    return {"kind": "move", "name": name, "id": names.index(name)}


def action_text(name: str) -> str:
    """How the policy writes action `name` (what the experts emit)."""
    return f"<action>{name}</action>"


def invalid_text(names: Sequence[str]) -> str:
    return f"invalid action: write one of {', '.join(names)} as <action>{names[0]}</action>. "


class GymTextEnv:
    """A `GymGame` as a taurl `Env` (inline observations; module docstring for the rules)."""

    observation_style = "inline"
    stop = (STOP,)
    tools: list[dict[str, Any]] = []  # actions are plain text, not tool calls

    def __init__(self, game: GymGame, max_turns: int = 16, max_episode_steps: int | None = None):
        problems = []
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            problems.append(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if max_episode_steps is not None and (isinstance(max_episode_steps, bool)
                                              or not isinstance(max_episode_steps, int)
                                              or max_episode_steps < 1):
            problems.append("max_episode_steps must be None (the Gymnasium registration's "
                            f"TimeLimit) or an integer >= 1, got {max_episode_steps!r}")
        if problems:
            raise ConfigError(problems)
        self.game = game
        self.name, self.version, self.verifier_version = game.name, game.version, game.version
        self.system_prompt = game.system_prompt
        self.tools = []
        self.max_turns, self.max_episode_steps = max_turns, max_episode_steps
        self._gym: gymnasium.Env | None = None
        self._gym_key: Any = None
        self._obs: Any = None
        self._done = True
        self._turn = 0

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if task.env != self.name:
            raise ConfigError(f"task {task.task_id!r} is for env {task.env!r}, not {self.name!r}; "
                              "make the env the task names")
        key = (task.task_id, repr(sorted(task.metadata.items())))
        if self._gym is None or self._gym_key != key:  # the same task again reuses its env
            if self._gym is not None:
                self._gym.close()
            self._gym, self._gym_key = self.game.make(task, self.max_episode_steps), key
        self._obs = self.game.start(self._gym, task, seed)
        self._done, self._turn = False, 0
        info = {"task_id": task.task_id, "seed": seed, "env": self.name,
                "env_version": self.version,
                "max_turns": self.max_turns, "verifier_version": self.verifier_version,
                "gym_id": (self._gym.spec.id if self._gym.spec is not None
                           else type(self._gym.unwrapped).__name__),
                "provenance": self.game.world(task)}
        return "", info

    def compact_prompt(self, task: Task) -> str:
        """The task prompt with its last ``<information>`` (the start) replaced by the current
        state: where the episode stands, for the loop's ``compaction: {policy: env}``."""
        if self._gym is None:
            raise ResetNeeded(f"{self.name}: compact_prompt called before reset(); call "
                              "reset(task) first")
        head, sep, _ = task.prompt.rpartition("<information>")
        now = f"<information>{self.game.describe(self._gym, self._obs)}</information>"
        return f"{head}{now}" if sep else f"{task.prompt}\n{now}"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._gym is None or self._done:
            raise ResetNeeded(f"{self.name}: step called before reset() or after the episode "
                              "ended; call reset(task) first")
        self._turn += 1
        parsed = parse_action(action, self.game.action_names)
        info: dict[str, Any] = {"action": parsed, "invalid": parsed["kind"] == "invalid",
                                "turn": self._turn}
        reward, terminated, truncated, prefix = 0.0, False, False, ""
        if parsed["kind"] == "move":
            obs, gym_reward, terminated, truncated, _ = self._gym.step(parsed["id"])
            self._obs = obs
            info["gym_reward"] = float(gym_reward)
            truncated = bool(truncated) and not terminated
            terminated = bool(terminated)
        else:
            prefix = invalid_text(self.game.action_names)
        if terminated:
            success = bool(self.game.is_success(self._gym, self._obs))
            reward = 1.0 if success else 0.0
            info["stop_reason"] = self.game.stop_reasons[0 if success else 1]
        elif truncated or self._turn >= self.max_turns:
            truncated = True
            info["stop_reason"] = "max_turns"
        if terminated or truncated:
            info.update(reward_components={"outcome": reward},
                        verifier_version=self.verifier_version)
        self._done = terminated or truncated
        text = ("" if self._done
                else f"\n<information>{prefix}{self.game.describe(self._gym, self._obs)}"
                     "</information>\n")
        return text, reward, terminated, truncated, info
