"""The public Python API: `import taurl` is cheap, `taurl.train` runs the recipe from Python
(an env factory, a list of Tasks, a reward function; no YAML, no registration by hand) and
checks its arguments as the CLI does, before any file is written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import taurl
import taurl.envs
from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.errors import ConfigError, Error
from word_env import EchoEnv

SRC = Path(__file__).resolve().parents[1] / "src"


WORDS = ["apple", "berry", "cedar", "delta", "ember", "fjord", "grape", "hazel", "igloo", "joker",
         "kiwi", "lemon", "mango", "nutmeg"]


def tasks() -> list[taurl.Task]:
    splits = ["train"] * 8 + ["validation"] * 3 + ["holdout"] * 3
    return [
        taurl.Task(f"echo/{w}", f"Say: {w}", (w,), s, "echo-v0")
        for w, s in zip(WORDS, splits, strict=True)
    ]


def length_reward(traj, task) -> float:
    """A reward the env does not give: how much of its token budget the answer used."""
    return min(1.0, len(traj.turns[0].action_text) / 40)


SMALL = dict(updates=2, tasks_per_update=2, group_size=4, eval_tasks=2, eval_trials=1,
             max_action_tokens=8, max_episode_tokens=8, seed=3)


def test_import_taurl_is_cheap_and_names_the_api():
    code = (
        "import sys, taurl; heavy = [m for m in ('torch', 'transformers') if m in sys.modules]; "
        "assert not heavy, heavy; taurl.train; taurl.evaluate; taurl.register; taurl.Env; "
        "taurl.Task; taurl.TrainConfig; assert callable(taurl.train) and callable(taurl.evaluate); "
        "print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(SRC)}
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_train_from_python_with_a_factory_tasks_and_a_reward(tmp_path):
    """In a child process whose output is a pipe (CI, a log file): the run trains two updates,
    its records carry the reward function's outcome, and its output is plain lines: one per
    update, no carriage-return bar fragments, no dependency's progress bars."""
    run_dir = tmp_path / "run"
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import taurl, test_api as t; "
        "s = taurl.train(t.EchoEnv, tasks=t.tasks(), reward=t.length_reward, run_dir=sys.argv[2], "
        "**t.SMALL); print('updates', s['train']['updates'], s['env'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent), str(run_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "updates 2 echoenv+length-reward-v0"
    assert [x.split()[1] for x in out.stdout.splitlines() if x.startswith("update ")] == [
        "1/2",
        "2/2",
    ]
    for shown in (out.stdout, out.stderr):
        assert (
            "\r" not in shown
            and "Writing model shards" not in shown
            and "Loading weights" not in shown
        )
    # the phase, in a line
    assert re.search(r"^rl: 2/2 update in [0-9.]+ s$", out.stdout, re.M), out.stdout
    with Ledger(RunDir(run_dir).ledger) as ledger:
        trajs = ledger.query(split="train")
    assert len(trajs) == 2 * 2 * 4
    by_task = {t.task_id: t for t in tasks()}
    for traj in trajs:  # the outcome is the reward function's; the env's other layers are kept
        assert traj.reward_components["outcome"] == pytest.approx(
            length_reward(traj, by_task[traj.task_id])
        )
        assert traj.reward_components["shaping"] == 0.0
        assert traj.reward == pytest.approx(sum(traj.reward_components.values()))
        assert traj.verifier_version == "python:length-reward"
    # a signal the env alone (always 0 here) would not give
    assert len({t.reward for t in trajs}) > 1
    # the run directory describes the run: its tasks and its config (which names the registered env)
    assert len((run_dir / "tasks.jsonl").read_text().splitlines()) == len(WORDS)
    assert "env: echoenv+length-reward-v0" in (run_dir / "config.yaml").read_text()


def test_a_factory_is_registered_once_per_reward():
    from taurl.api import _env_name

    plain, scored = _env_name(EchoEnv, None), _env_name(EchoEnv, length_reward)
    assert (
        plain != scored
        and _env_name(EchoEnv, length_reward) == scored
        and _env_name(EchoEnv, None) == plain
    )
    assert taurl.envs.spec(scored).make_verifier()(_FakeTraj(), tasks()[0]) == pytest.approx(0.25)


class _FakeTraj:
    episode_id = "e"
    turns = (type("T", (), {"action_text": "x" * 10})(),)


@pytest.mark.parametrize("kwargs, message", [
    ({"config": taurl.TrainConfig(updates="30")}, "updates must be int"),
    ({"updates": "30"}, "updates must be int"),
    ({"updatez": 3}, "did you mean 'updates'"),
    ({"config": {"imports": ["no_such_module_xyz"]}}, "No module named 'no_such_module_xyz'"),
    ({"tasks": [{"task_id": "a"}]}, "not a taurl.Task"),
    ({"tasks": [taurl.Task("a", "p", (), "test", "x")]}, "'test' is not one of"),
    ({"model": ("not", "a model")}, "loaded (model, tokenizer)"),
    ({"reward": 3}, "reward must be a function"),
])
def test_bad_arguments_are_refused_before_any_file_is_written(tmp_path, kwargs, message):
    args = {
        "tasks": tasks(),
        "run_dir": tmp_path / "r",
        **{k: v for k, v in SMALL.items() if k != "updates"},
    }
    with pytest.raises(Error) as e:
        taurl.train(EchoEnv, **{**args, **kwargs})
    assert message in str(e.value)
    assert not (tmp_path / "r").exists()


def test_env_argument_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="env first"):
        taurl.train(taurl.TrainConfig(), run_dir=tmp_path / "r")
    with pytest.raises(Error, match="Did you mean 'search-v0'"):
        taurl.train("search-v9", run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_the_recipe_checks_a_config_built_in_python(tmp_path):
    from taurl.recipe.loop import train

    with pytest.raises(ConfigError, match=r"updates must be int \(got '30'\)"):
        train(taurl.TrainConfig(updates="30"), str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


def test_one_name_per_protocol():
    from taurl.envs.spec import Verifier as EvaluatorVerifier
    from taurl.reward import Judge
    from taurl.reward.stack import Verifier

    assert Verifier is Judge and EvaluatorVerifier is not Judge  # the old name still imports
