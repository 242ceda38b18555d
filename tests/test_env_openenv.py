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
    by = {
        s: envs.make_tasks("openenv", s, 6, seed=2, env_config=APP)
        for s in ("train", "validation", "holdout")
    }
    seeds = {s: {t.metadata["reset_seed"] for t in ts} for s, ts in by.items()}
    assert all(len(v) == 6 for v in seeds.values())
    assert not (seeds["train"] & seeds["holdout"] or seeds["train"] & seeds["validation"]
                or seeds["validation"] & seeds["holdout"])
    # the server's reset text
    assert all(t.prompt.startswith("Make the total ") for ts in by.values() for t in ts)


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
    # schema checked by the gate
    assert env.step(call("add", n="x"))[4]["receipt"].decision == "denied"
    obs, r, term, trunc, step = env.step(call("submit"))
    assert (r, term, step["stop_reason"]) == (1.0, True, "done")

    from taurl.data.trajectory import ToolReceipt

    class Turn:
        def __init__(self, text, decision):
            self.action_text, self.receipt = text, ToolReceipt("t", {}, decision, "ok")

    class Record:
        task_id, terminated, provenance = task.task_id, True, info["provenance"]
        turns = [
            Turn(call("add", n=target), "allowed"),
            Turn(call("clear"), "denied"),
            Turn(call("submit"), "allowed"),
        ]

    verifier = envs.spec("openenv").make_verifier()
    assert verifier(Record(), task) == 1.0
    Record.turns = [Turn(call("add", n=target + 1), "allowed"), Turn(call("submit"), "allowed")]
    assert verifier(Record(), task) == 0.0


def test_sessions_are_closed_so_a_server_of_one_session_serves_every_episode(on_path):
    """Issue 38 H2: each OpenEnvEnv opened a WebSocket session that nothing closed, so a
    server with openenv-core's default cap (one session) refused the second env. Here the
    real loop's runner (`run_one`, what every collector calls) runs episodes one after the
    other against such a server: ended by the server's done, and cut by the loop's own turn
    budget (the env never sees an end); then the replay verifier, then an env built only for
    its tools. Each needs the one slot the others must have given back."""
    import asyncio

    from taurl.policy import build_tokenizer
    from taurl.rollout.episodes import EpisodeSpec
    from taurl.rollout.loop import RolloutConfig
    from taurl.rollout.runner import run_one
    from taurl.rollout.synth import ScriptedEngine

    cap1 = {"app": "openenv_target_cap1:app"}  # create_app's default max_concurrent_envs
    tasks = envs.make_tasks("openenv", "train", 2, seed=0, env_config=cap1)
    tok = build_tokenizer([call("add", n=1), call("submit")] * 4, vocab_size=300)

    def episode(i, task, actions, max_turns):
        spec = EpisodeSpec(f"e{i}", task, i, f"g{i}")
        engine, make_env = ScriptedEngine(tok, actions), lambda: envs.make("openenv", **cap1)
        config = RolloutConfig(max_turns=max_turns)
        return asyncio.run(run_one(engine, make_env, tok, spec, config=config, run_id="r"))

    records = []
    for i, task in enumerate(tasks * 2):
        target = int(task.prompt.split()[3])
        solved = episode(i, task, [call("add", n=target), call("submit")], max_turns=4)
        cut = episode(10 + i, task, [call("add", n=1)], max_turns=1)  # the loop ends it
        assert not isinstance(solved, str) and not isinstance(cut, str), (solved, cut)
        assert (solved.reward, str(solved.stop_reason)) == (1.0, "done")
        assert str(cut.stop_reason) == "max_turns"
        records.append((solved, task))
    verifier = envs.spec("openenv").make_verifier()
    assert [verifier(t, task) for t, task in records] == [1.0] * len(records)
    assert envs.make("openenv", **cap1).tools  # the verifier's own session is closed too


@pytest.mark.parametrize("target", [{"app": "openenv_target:app_no_config_names"},
                                    {"url": "http://127.0.0.1:9"}])
def test_the_verifier_starts_or_dials_only_what_a_config_names(on_path, target):
    """Issue 38: the verifier replayed on whatever server a record's provenance named, so
    evaluating someone else's ledger imported the app (code) or dialled the URL it chose."""
    from types import SimpleNamespace

    from taurl.envs import openenv_server_proc

    task = envs.make_tasks("openenv", "holdout", 1, seed=0, env_config=APP)[0]
    record = SimpleNamespace(task_id=task.task_id, terminated=True, turns=[],
                             provenance={"env_config": target})
    with pytest.raises(ConfigError, match="which no env config of this process names"):
        envs.spec("openenv").make_verifier()(record, task)
    assert target.get("app") not in openenv_server_proc._SERVERS  # never started


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_the_server_process_dies_with_a_parent_killed_by_sigterm(tmp_path):
    """Issue 38: the server was stopped by an exit handler only, which SIGTERM's default
    action skips: the uvicorn child outlived its parent, holding its port."""
    import os
    import signal
    import subprocess
    import time

    script = ("import sys, time; sys.path.insert(0, sys.argv[1]); "
              "from taurl.envs import openenv_server_proc as p; "
              "p.server_url('openenv_target:app'); "
              "print(p._SERVERS['openenv_target:app'][0].pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", script, str(FIXTURES)], stdout=subprocess.PIPE,
                              text=True)
    server = 0
    try:
        server = int(parent.stdout.readline())
        assert _alive(server)
        parent.send_signal(signal.SIGTERM)
        parent.wait(10)
        deadline = time.monotonic() + 15
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server), "the OpenEnv server outlived the process that started it"
    finally:
        parent.kill()
        if server and _alive(server):  # (the failure above: end the orphan this test made)
            os.kill(server, signal.SIGKILL)


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
    assert (
        main(
            [
                "train", "--env", "openenv", "--env-config", json.dumps(APP), "--sft", "none",
                "--run-dir", str(run), "--no-progress", "--updates", "2", "--tasks-per-update", "2",
                "--group-size", "2", "--eval-tasks", "3", "--eval-trials", "1", "--max-turns", "2",
                "--max-action-tokens", "12", "--max-episode-tokens", "24", "--concurrency", "4",
                "--vocab-size", "300",
            ]
        )
        == 0
    ), capsys.readouterr().err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    prov = summary["env_provenance"]
    assert summary["train"]["updates"] == 2 and (prov["package"], prov["env_id"]) == (
        "openenv-core",
        APP["app"],
    )
    assert summary["holdout"]["final"]["tasks"] == 3
    with Ledger(run / "ledger.sqlite") as ledger:
        records = list(ledger.iter_query())
    assert records and all(
        t.provenance["package"] == "openenv-core" and isinstance(t.provenance["seed"], int)
        for t in records
    )


@pytest.mark.slow  # ~40 s idle (the recipe end to end)
def test_taurl_train_against_a_server_of_one_session(tmp_path, on_path, monkeypatch, capsys):
    """Issue 38 H2, end to end: before, `taurl train` on a server with openenv-core's default
    cap (one session) failed at start (the recipe's own envs held the slot); the episodes now
    run one at a time (--concurrency 1) on that one session slot, each giving it back."""
    from taurl.cli.main import main

    monkeypatch.setattr(sys, "path", list(sys.path))
    run = tmp_path / "r"
    cap1 = json.dumps({"app": "openenv_target_cap1:app"})
    assert main(["train", "--env", "openenv", "--env-config", cap1,
                 "--sft", "none", "--run-dir", str(run), "--no-progress", "--updates", "2",
                 "--tasks-per-update", "2", "--group-size", "2", "--eval-tasks", "2",
                 "--eval-trials", "1",
                 "--max-turns", "2", "--max-action-tokens", "12", "--max-episode-tokens", "24",
                 "--concurrency", "1", "--vocab-size", "300"]) == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train"]["updates"] == 2 and summary["holdout"]["final"]["tasks"] == 2
