"""OpenEnv (`openenv-core`) servers as taurl envs (taurl.envs.openenv_bridge), with the real
package: an MCP env built from openenv-core's own classes (tests/fixtures/openenv_target.py)
served by its create_app in a server process the adapter starts; tools behind the host
gate; the replay verifier; `taurl train --env openenv` for 2 updates."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from taurl import envs
from taurl.errors import ConfigError

pytest.importorskip("openenv.core", reason="pip install 'taurl[ecosystem]' (openenv-core)")
FIXTURES = Path(__file__).parent / "fixtures"
APP = {"app": "openenv_target:app"}


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))


def test_tasks_are_reset_seeds_split_by_hash(on_path):
    by = {s: envs.make_tasks("openenv", s, 6, seed=2, env_config=APP) for s in ("train", "validation", "holdout")}
    seeds = {s: {t.metadata["reset_seed"] for t in ts} for s, ts in by.items()}
    assert all(len(v) == 6 for v in seeds.values())
    assert not (seeds["train"] & seeds["holdout"] or seeds["train"] & seeds["validation"]
                or seeds["validation"] & seeds["holdout"])
    assert all(t.prompt.startswith("Make the total ") for ts in by.values() for t in ts)  # the server's reset text


def test_mcp_tools_behind_the_gate_and_the_replay_verifier(on_path):
    task = envs.make_tasks("openenv", "holdout", 1, seed=0, env_config=APP)[0]
    target = int(task.prompt.split()[3])
    env = envs.make("openenv", max_turns=6, scopes={"clear": ["destructive"]}, **APP)
    assert [t["function"]["name"] for t in env.tools] == ["add", "clear", "submit"]
    _, info = env.reset(task, seed=0)
    assert info["provenance"]["package"] == "openenv-core" and info["provenance"]["mcp"] is True
    assert env.step(call("add", n=2))[0] == "2"
    obs, r, term, trunc, step = env.step(call("clear"))
    assert step["receipt"].decision == "denied" and not term
    assert env.step(call("add", n=target - 2))[0] == str(target)  # clear never reached the server
    assert env.step(call("add", n="x"))[4]["receipt"].decision == "denied"  # schema checked by the gate
    obs, r, term, trunc, step = env.step(call("submit"))
    assert (r, term, step["stop_reason"]) == (1.0, True, "done")

    from taurl.data.trajectory import ToolReceipt

    class Turn:
        def __init__(self, text, decision):
            self.action_text, self.receipt = text, ToolReceipt("t", {}, decision, "ok")

    class Record:
        task_id, terminated, provenance = task.task_id, True, info["provenance"]
        turns = [Turn(call("add", n=target), "allowed"), Turn(call("clear"), "denied"), Turn(call("submit"), "allowed")]

    verifier = envs.spec("openenv").make_verifier()
    assert verifier(Record(), task) == 1.0
    Record.turns = [Turn(call("add", n=target + 1), "allowed"), Turn(call("submit"), "allowed")]
    assert verifier(Record(), task) == 0.0


def test_bad_config_is_a_clear_error():
    with pytest.raises(ConfigError, match="exactly one of env_config 'url'"):
        envs.make("openenv")
    with pytest.raises(ConfigError, match="no option"):
        envs.make("openenv", app="x:y", bogus=1)
    with pytest.raises(ConfigError, match="did not start"):
        envs.make("openenv", app="no_such_module_xyz:app")


@pytest.mark.slow  # ~30 s idle (the recipe end to end); minutes on a loaded machine
def test_taurl_train_two_updates_with_provenance(tmp_path, on_path, monkeypatch, capsys):
    from taurl.cli.main import main
    from taurl.data.ledger import Ledger

    monkeypatch.setattr(sys, "path", list(sys.path))
    run = tmp_path / "r"
    assert main(["train", "--env", "openenv", "--env-config", json.dumps(APP), "--sft", "none",
                 "--run-dir", str(run), "--no-progress", "--updates", "2", "--tasks-per-update", "2",
                 "--group-size", "2", "--eval-tasks", "3", "--eval-trials", "1", "--max-turns", "2",
                 "--max-action-tokens", "12", "--max-episode-tokens", "24", "--concurrency", "4",
                 "--vocab-size", "300"]) == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    prov = summary["env_provenance"]
    assert summary["train"]["updates"] == 2 and (prov["package"], prov["env_id"]) == ("openenv-core", APP["app"])
    assert summary["holdout"]["final"]["tasks"] == 3
    with Ledger(run / "ledger.sqlite") as ledger:
        records = list(ledger.iter_query())
    assert records and all(t.provenance["package"] == "openenv-core" and isinstance(t.provenance["seed"], int)
                           for t in records)
