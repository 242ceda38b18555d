"""The recipe runs `check_env` on the env it is given (registered or imported), on one task,
before any work: a broken env is refused with what to fix and no file written; a good one's
check is recorded in the run's metrics."""

from __future__ import annotations

import json

import pytest

from taurl import envs
from taurl.envs.core import Task
from taurl.errors import EnvCheckError, ResetNeeded
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train


class AnswerEnv:
    """One answer turn; `INFO` decides what its step returns as info (a broken env: a list)."""

    name, version, verifier_version = "checked-answer-v0", "1", "checked-answer-1"
    observation_style, stop, tools = "inline", ("</answer>",), []
    system_prompt = ""
    INFO: dict = {}

    def __init__(self, max_turns: int = 1):
        self.task = None

    def reset(self, task, seed=None):
        self.task = task
        return "", {}

    def step(self, action):
        if self.task is None:
            raise ResetNeeded("checked-answer-v0: reset first")
        answer = action.split("<answer>")[-1].removesuffix("</answer>").strip()
        reward, self.task = float(answer == self.task.answers[0]), None
        info = {"action": {"kind": "answer"}, "invalid": False, "stop_reason": "answered"}
        return "", reward, True, False, AnswerEnv.INFO.get("broken", info)


def answer_tasks(split, n, seed=0):
    offset = {"train": 0, "validation": 1, "holdout": 2}[split]
    words = [f"{a}{b}{c}" for a in "abcdefgh" for b in "abcdefgh" for c in "abcd"]
    return [Task(f"w/{w}", f"Say: {w}", (w,), split, "checked-answer-v0") for w in words[offset::3]][:n]


def answer_expert(task, rng):
    return [f"<answer>{task.answers[0]}</answer>"]


if "checked-answer-v0" not in envs.registered():
    envs.register("checked-answer-v0", AnswerEnv, tasks=answer_tasks, expert=answer_expert)

TINY = dict(env="checked-answer-v0", demos=8, sft_epochs=1, sft_batch_size=8, updates=1, tasks_per_update=2,
            group_size=2, eval_tasks=2, eval_trials=1, max_turns=1, max_action_tokens=6, max_episode_tokens=6,
            concurrency=4, tokenizer_texts=200)


def test_an_env_that_breaks_the_protocol_is_refused_before_any_file(tmp_path, monkeypatch):
    """Before: the run went on and every episode became an error record (or died)."""
    monkeypatch.setitem(AnswerEnv.INFO, "broken", ["not", "a", "dict"])
    run_dir = tmp_path / "run"
    with pytest.raises(EnvCheckError, match=r"'checked-answer-v0' failed taurl's env check on task 'w/.*info must be a dict"):
        train(TrainConfig(**TINY), str(run_dir), progress=False)
    assert not run_dir.exists()


def test_the_env_check_of_a_good_env_is_in_the_run_metrics(tmp_path):
    train(TrainConfig(**TINY), str(tmp_path / "run"), progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    (check,) = [r for r in rows if r["phase"] == "env_check"]
    assert check["env/check_passed"] == 1.0 and check["env/check_task"].startswith("w/")
