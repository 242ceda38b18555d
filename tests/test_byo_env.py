"""Bring your own environment: an installed package's entry point is found without
--import, and bad input is refused before any file is written. No taurl file is edited for
any of it. (The example of docs/environments/your-own.md runs verbatim in tests/test_docs.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TAURL = str(Path(sys.executable).with_name("taurl"))
PLUGIN = Path(__file__).parent / "fixtures" / "plugin"


def example_env() -> str:
    """The example env module of docs/environments/your-own.md
    (``<!-- runnable:my_envs.py -->``)."""
    text = (ROOT / "docs" / "environments" / "your-own.md").read_text()
    return re.search(r"<!-- runnable:my_envs.py -->\n```\w*\n(.*?)```", text, re.S).group(1)


def run(cmd: str | list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PATH": f"{Path(TAURL).parent}:{os.environ['PATH']}", **env}
    return subprocess.run(cmd, cwd=cwd, shell=isinstance(cmd, str), capture_output=True, text=True,
                          env=full_env, timeout=600)


def test_installed_entry_point_env_is_listed_and_trains(tmp_path):
    env = {"PYTHONPATH": str(PLUGIN)}  # the dist-info makes it an installed distribution
    listed = run([TAURL, "envs"], tmp_path, **env)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("fixture-echo-v0"))
    assert "entry point fixture-echo" in line and "tasks+expert" in line
    proc = run(
        [
            TAURL, "train", "--env", "fixture-echo-v0", "--run-dir", "r", "--no-progress",
            "--demos", "16", "--sft-epochs", "1", "--updates", "2", "--tasks-per-update", "2",
            "--group-size", "2", "--eval-tasks", "3", "--eval-trials", "1", "--max-turns", "1",
            "--max-action-tokens", "6", "--max-episode-tokens", "6",
        ],
        tmp_path,
        **env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    assert summary["env"] == "fixture-echo-v0" and summary["train"]["updates"] == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--import", "no_such_module_xyz"], "No module named 'no_such_module_xyz'"),
        (["--env", "reverse-v9", "--import", "my_envs"], "Did you mean 'reverse-v0'"),
        (
            ["--import", "my_envs", "--env", "reverse-v0", "--env-config", '{"max_turn": 2}'],
            "did you mean 'max_turns'",
        ),
        (
            ["--import", "my_envs", "--env", "reverse-v0", "--expert-options", '{"p_bad": 1}'],
            "has no option 'p_bad'",
        ),
        (
            ["--env", "search-v0", "--task-options", '{"split_bye": "city"}'],
            "did you mean 'split_by'",
        ),
        (["--env", "search-v0", "--model", "no/such/dir"], "model:"),
    ],
)
def test_bad_input_is_refused_before_any_file_is_written(
    tmp_path, monkeypatch, capsys, args, message
):
    """In-process `taurl.cli.main.main` (the console script's entry point): exit 1, the message,
    no traceback, no run directory."""
    from taurl.cli.main import main

    (tmp_path / "my_envs.py").write_text(example_env())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["train", "--run-dir", "r", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()


def test_task_file_keeps_good_rows_and_counts_bad_ones(tmp_path):
    from taurl.envs.tasks import read_task_file

    rows = [
        {"task_id": "a", "prompt": "p", "answers": ["x"], "split": "train"},
        "not an object",
        {"task_id": "b", "prompt": "p", "split": "test"},
        {"task_id": "a", "prompt": "dup", "split": "holdout"},
        {"task_id": "c", "prompt": "p", "answers": ["y"], "split": "holdout", "metadata": {"k": 1}},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    tf = read_task_file(path, "reverse-v0")
    assert [t.task_id for t in tf.by_split["train"]] == ["a"] and [
        t.task_id for t in tf.by_split["holdout"]
    ] == ["c"]
    assert (
        tf.by_split["holdout"][0].metadata == {"k": 1}
        and tf.by_split["holdout"][0].env == "reverse-v0"
    )
    assert len(tf.problems) == 4
    assert any(":2:" in p and "not a JSON object" in p for p in tf.problems)
    assert any(":3:" in p and "'test'" in p for p in tf.problems)
    assert any(":4:" in p and "duplicate" in p for p in tf.problems)
    assert any(":6:" in p and "not JSON" in p for p in tf.problems)
