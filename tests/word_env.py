"""One-answer-turn word envs for recipe tests (imported by the test modules, never collected).

`EchoEnv`: the agent says a word, the reward is 1 when it is the task's answer. `word_tasks`
builds a registered env's task source (three-letter words, disjoint by split) and
`say_the_answer` is its expert. tests/fixtures/plugin keeps a copy of its own: that package
is installed alone, without the tests.
"""

from __future__ import annotations

from typing import Any

from taurl.envs.core import Task
from taurl.errors import ResetNeeded

WORDS = [f"{a}{b}{c}" for a in "abcdefgh" for b in "abcdefgh" for c in "abcd"]
OFFSET = {"train": 0, "validation": 1, "holdout": 2}


def answer_of(action: str) -> str:
    """The text inside an action's last ``<answer>`` tag."""
    return action.split("<answer>")[-1].removesuffix("</answer>").strip()


class EchoEnv:
    """One turn: the agent says a word; the env's own reward is 1 when it is the task's.

    `INFO` is a test's switch: ``INFO["broken"]``, when set, is what `step` returns as its
    info (a broken env)."""

    name, version, verifier_version = "echo-v0", "1", "echo-exact-1"
    observation_style, stop, tools = "inline", ("</answer>",), []
    system_prompt = "Repeat the word as <answer>word</answer>."
    INFO: dict[str, Any] = {}

    def __init__(self, max_turns: int = 1):  # every env takes the config's max_turns
        self.task = None

    def reset(self, task, seed=None):
        self.task = task
        return "", {}

    def step(self, action):
        if self.task is None:
            raise ResetNeeded(f"{self.name}: call reset() first")
        reward = float(answer_of(action) == self.task.answers[0])
        self.task = None  # one turn: the episode is over
        info = {
            "action": {"kind": "answer"},
            "invalid": False,
            "stop_reason": "answered",
            "reward_components": {"outcome": reward, "shaping": 0.0},
            "verifier_version": self.verifier_version,
        }
        return "", reward, True, False, EchoEnv.INFO.get("broken", info)


def word_tasks(env: str, prompt: str, prefix: str = "w"):
    """A task source for `env` (``tasks(split, n, seed)``): "{prompt}: {word}", answer the word."""

    def tasks(split: str, n: int, seed: int = 0) -> list[Task]:
        return [
            Task(f"{prefix}/{w}", f"{prompt}: {w}", (w,), split, env)
            for w in WORDS[OFFSET[split] :: 3]
        ][:n]

    return tasks


def say_the_answer(task: Task, rng) -> list[str]:
    """The expert: one action, the right answer."""
    return [f"<answer>{task.answers[0]}</answer>"]
