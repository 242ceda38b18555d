"""Smoke runs of the `taurl` CLI with tiny budgets: rollout -> export -> inspect."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from taurl.cli.main import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "smoke"
    code = main(
        [
            "rollout", "--run-dir", str(run), "--episodes", "6", "--group-size", "3", "--max-turns",
            "2", "--max-action-tokens", "8", "--no-progress",
        ]
    )
    assert code == 0
    return run


def test_rollout_writes_the_run_directory(run_dir):
    assert (run_dir / "ledger.sqlite").exists()
    assert (run_dir / "checkpoints" / "v0" / "config.json").exists()
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["episodes"] == 6 and cfg["env"] == "search-v0"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["rollout/episodes"] == 6 and metrics[-1]["rollout/ledger_rejections"] == 0


def test_export_both_formats(run_dir, capsys):
    assert main(["export", str(run_dir), "--format", "jsonl"]) == 0
    assert main(["export", str(run_dir), "--format", "parquet"]) == 0
    rows = [
        json.loads(line)
        for line in (run_dir / "exports" / "trajectories.jsonl").read_text().splitlines()
    ]
    table = pq.read_table(run_dir / "exports" / "trajectories.parquet")
    assert len(rows) == table.num_rows == 6
    for row in rows:
        assert (
            len(row["token_ids"])
            == len(row["action_mask"])
            == len(row["logprobs"])
            == row["num_tokens"]
        )
    assert table.column("episode_id").to_pylist() == [r["episode_id"] for r in rows]


def test_inspect_shows_masks(run_dir, capsys):
    assert main(["inspect", str(run_dir), "--index", "1", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "mask=1" in out and "mask=0" in out and "⟦" in out and "stop_reason=" in out


def test_bad_config_reports_every_problem(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("episods: 3\ntemperature: -1\ntop_p: 2\n")
    assert main(["rollout", "--run-dir", str(tmp_path / "r"), "--config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "did you mean 'episodes'" in err
    assert (
        main(["rollout", "--run-dir", str(tmp_path / "r"), "--temperature", "-1", "--top-p", "2"])
        == 1
    )
    err = capsys.readouterr().err
    assert "temperature" in err and "top_p" in err and "2 problem" in err


def test_inspect_of_a_missing_run_says_how_to_fix(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope")]) == 1
    assert "taurl rollout --run-dir" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--env-config", '{"top_kk": 1}'], "did you mean 'top_k'"),
    # a value only the env's constructor checks
    (["--env-config", '{"top_k": 0}'], "top_k must be an integer >= 1"),
    (["--env", "serch-v0"], "Did you mean 'search-v0'"),
    (["--task-options", '{"split_bye": "city"}'], "did you mean 'split_by'"),
    (["--split", "test"], "split must be train, validation or holdout"),
    (["--model", "no/such/dir"], "model:"),
])
def test_rollout_bad_input_writes_nothing(tmp_path, capsys, args, message):
    """Refused before any work: exit 1, the message, no traceback, no run directory."""
    assert main(["rollout", "--run-dir", str(tmp_path / "r"), "--episodes", "2", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()


def test_failed_rollout_leaves_an_existing_run_unchanged(run_dir, capsys):
    """A rollout into an existing run that fails changes nothing there."""
    before = {
        p: p.read_bytes()
        for p in Path(run_dir).rglob("*")
        if p.is_file() and "ledger" not in p.name
    }
    assert main(["rollout", "--run-dir", str(run_dir), "--env-config", '{"top_kk": 1}']) == 1
    assert "top_kk" in capsys.readouterr().err
    after = {
        p: p.read_bytes()
        for p in Path(run_dir).rglob("*")
        if p.is_file() and "ledger" not in p.name
    }
    assert after == before


@pytest.mark.parametrize("env", ["code-v0", "frozenlake-v0"])
def test_rollout_builds_the_default_policy_for_any_env(tmp_path, env):
    """The default policy's tokenizer texts come from the env's own training tasks, however
    few it has (code-v0 has ~4,000 distinct training tasks)."""
    run = tmp_path / "r"
    assert (
        main(
            [
                "rollout", "--env", env, "--run-dir", str(run), "--episodes", "2", "--max-turns",
                "1", "--max-action-tokens", "4", "--no-progress",
            ]
        )
        == 0
    )
    assert (run / "checkpoints" / "v0" / "config.json").exists()
