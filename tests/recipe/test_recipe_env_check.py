"""The recipe runs `check_env` on the env it is given (registered or imported), on one task,
before any work: a broken env is refused with what to fix and no file written; a good one's
check is recorded in the run's metrics."""

from __future__ import annotations

import json

import pytest

from taurl import envs
from taurl.errors import EnvCheckError
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train
from word_env import EchoEnv, say_the_answer, word_tasks

if "checked-answer-v0" not in envs.registered():
    envs.register(
        "checked-answer-v0", EchoEnv, tasks=word_tasks("checked-answer-v0", "Say"),
        expert=say_the_answer,
    )

TINY = dict(
    env="checked-answer-v0", demos=8, sft_epochs=1, sft_batch_size=8, updates=1, tasks_per_update=2,
    group_size=2, eval_tasks=2, eval_trials=1, max_turns=1, max_action_tokens=6,
    max_episode_tokens=6, concurrency=4, tokenizer_texts=200, system_prompt="",
)


def test_an_env_that_breaks_the_protocol_is_refused_before_any_file(tmp_path, monkeypatch):
    """Before: the run went on and every episode became an error record (or died)."""
    monkeypatch.setitem(EchoEnv.INFO, "broken", ["not", "a", "dict"])
    run_dir = tmp_path / "run"
    with pytest.raises(
        EnvCheckError,
        match=r"'checked-answer-v0' failed taurl's env check on task 'w/.*info must be a dict",
    ):
        train(TrainConfig(**TINY), str(run_dir), progress=False)
    assert not run_dir.exists()


def test_the_env_check_of_a_good_env_is_in_the_run_metrics(tmp_path):
    train(TrainConfig(**TINY), str(tmp_path / "run"), progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    (check,) = [r for r in rows if r["phase"] == "env_check"]
    assert check["env/check_passed"] == 1.0 and check["env/check_task"].startswith("w/")
