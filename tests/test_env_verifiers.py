"""verifiers environments as taurl envs (taurl.envs.verifiers_bridge), with the real
`verifiers` package: an environment package built from verifiers' own classes
(tests/fixtures/vf_fixture_env.py: SingleTurnEnv, ToolEnv, a MultiTurnEnv with a stop
condition), loaded by `verifiers.load_environment`; its rubric as the reward; the replay
verifier; `taurl train --env verifiers` for 2 updates."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from taurl import envs
from taurl.errors import ConfigError

pytest.importorskip("verifiers", reason="pip install 'taurl[ecosystem]' (verifiers)")
FIXTURES = Path(__file__).parent / "fixtures"


def cfg(kind: str) -> dict:
    return {"env_id": "vf-fixture-env", "env_args": {"kind": kind}}


@pytest.fixture(autouse=True)
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))


def record(task, env_info, actions):
    turns = [SimpleNamespace(action_text=a) for a in actions]
    return SimpleNamespace(
        task_id=task.task_id, terminated=True, turns=turns, provenance=env_info["provenance"]
    )


def test_rows_split_without_sharing_and_rubric_is_the_reward():
    by = {s: envs.make_tasks("verifiers", s, 30, seed=1, env_config=cfg("single")) for s in
          ("train", "validation", "holdout")}
    keys = {s: {t.prompt for t in ts} for s, ts in by.items()}
    assert not (keys["train"] & keys["holdout"] or keys["train"] & keys["validation"]
                or keys["validation"] & keys["holdout"])
    task = by["holdout"][0]
    env = envs.make("verifiers", **cfg("single"))
    assert env.kind == "single_turn" and env.system_prompt == "Answer with the number."
    _, info = env.reset(task, seed=0)
    assert (info["provenance"]["package"], info["provenance"]["env_id"]) == (
        "verifiers",
        "vf-fixture-env",
    )
    obs, r, term, trunc, step = env.step(f"It is {task.answers[0]}")
    assert (r, term) == (1.0, True) and step["reward_components"]["rubric/exact_sum"] == 1.0
    env.reset(task)
    assert env.step("It is 1000")[1] == 0.0
    verifier = envs.spec("verifiers").make_verifier()
    assert verifier(record(task, info, [f"It is {task.answers[0]}"]), task) == 1.0
    assert verifier(record(task, info, ["It is 1000"]), task) == 0.0


def test_tool_env_runs_its_tools_with_receipts():
    task = envs.make_tasks("verifiers", "holdout", 1, env_config=cfg("tool"))[0]
    env = envs.make("verifiers", max_turns=4, **cfg("tool"))
    assert env.kind == "tool" and env.tools[0]["function"]["name"] == "add"
    a, b = (int(x.strip("?")) for x in task.prompt.split()[2::2])
    env.reset(task)
    obs, r, term, trunc, info = env.step(
        f"<tool_call>{json.dumps({'name': 'add', 'arguments': {'a': a, 'b': b}})}</tool_call>"
    )
    assert obs == str(a + b) and info["receipt"].tool == "add" and not term
    obs, r, term, trunc, info = env.step(f"So {obs}")
    assert (r, term, info["reward_components"]["rubric/add_calls"]) == (1.0, True, 1.0)


def test_multi_turn_env_answers_and_stops_by_its_own_conditions():
    task = envs.make_tasks("verifiers", "holdout", 1, env_config=cfg("multi"))[0]
    env = envs.make("verifiers", max_turns=2, **cfg("multi"))
    _, info = env.reset(task)
    obs, r, term, trunc, step = env.step("0")
    assert obs.startswith("Not yet") and step["role"] == "user" and not term
    obs, r, term, trunc, step = env.step(task.answers[0])
    # the env's stop condition
    assert (r, term, step["stop_reason"]) == (1.0, True, "answered_right")
    env.reset(task)
    env.step("0")
    assert env.step("0")[1:4] == (0.0, False, True)  # max_turns: truncated, scored 0
    assert (
        envs.spec("verifiers").make_verifier()(record(task, info, ["0", task.answers[0]]), task)
        == 1.0
    )


def test_the_verifier_replays_what_the_env_saw_not_the_sampled_eos():
    """Issue 38 H1: a chat model ends its answer with EOS; the loop gives the env the text
    without it (reward 1), and the record keeps the text as sampled. Before, the verifier
    replayed that text, EOS included ("It is 7<|endoftext|>" does not end with 7): 0.0, so
    every holdout figure on a verifiers env was 0 and `sft: rejection` kept nothing."""
    import asyncio

    from taurl.policy import build_tokenizer
    from taurl.proxy.experts import ReplyEngine
    from taurl.rollout.loop import RolloutConfig, run_episode

    task = envs.make_tasks("verifiers", "holdout", 1, env_config=cfg("single"))[0]
    env = envs.make("verifiers", **cfg("single"))
    tok = build_tokenizer([task.prompt, env.system_prompt, "It is 0123456789"] * 4, vocab_size=300)
    engine = ReplyEngine(tok, [f"It is {task.answers[0]}"])  # each reply ended by EOS
    traj = asyncio.run(run_episode(engine, env, tok, task, seed=0,
                                   config=RolloutConfig(max_turns=1)))
    turn = traj.turns[0]
    assert turn.finish_reason == "eos" and turn.action_text.endswith(tok.eos_token)
    assert traj.reward == 1.0 and turn.env_text == f"It is {task.answers[0]}"
    assert envs.spec("verifiers").make_verifier()(traj, task) == 1.0


def test_the_verifier_loads_only_an_environment_a_config_names():
    """A ledger someone else wrote names the module the replay verifier would import (its
    provenance's env_id): only (env_id, env_args) a config of this process named are loaded."""
    task = envs.make_tasks("verifiers", "holdout", 1, env_config=cfg("single"))[0]
    _, info = envs.make("verifiers", **cfg("single")).reset(task)
    verifier = envs.spec("verifiers").make_verifier()
    forged = {**info["provenance"], "env_id": "vf-fixture-env-never-configured"}
    with pytest.raises(ConfigError, match="no env config of this process names"):
        verifier(record(task, {"provenance": forged}, ["It is 1"]), task)
    assert "vf_fixture_env_never_configured" not in sys.modules
    other_args = {**info["provenance"], "env_args": {"kind": "multi", "steal": True}}
    with pytest.raises(ConfigError, match="no env config of this process names"):
        verifier(record(task, {"provenance": other_args}, ["It is 1"]), task)
    assert verifier(record(task, info, [f"It is {task.answers[0]}"]), task) == 1.0


def test_bad_config_is_a_clear_error():
    with pytest.raises(ConfigError, match="needs env_config 'env_id'"):
        envs.make("verifiers")
    with pytest.raises(ConfigError, match="could not load environment 'no-such-env-xyz'"):
        envs.make("verifiers", env_id="no-such-env-xyz")


@pytest.mark.slow  # ~30 s idle (the recipe end to end); minutes on a loaded machine
def test_taurl_train_two_updates_with_provenance(tmp_path, monkeypatch, capsys):
    from taurl.cli.main import main
    from taurl.data.ledger import Ledger

    monkeypatch.setattr(sys, "path", list(sys.path))
    run = tmp_path / "r"
    assert (
        main(
            [
                "train", "--env", "verifiers", "--env-config", json.dumps(cfg("single")), "--sft",
                "none", "--run-dir", str(run), "--no-progress", "--updates", "2",
                "--tasks-per-update", "2", "--group-size", "2", "--eval-tasks", "4",
                "--eval-trials", "1", "--max-turns", "1", "--max-action-tokens", "6",
                "--max-episode-tokens", "6", "--vocab-size", "300",
            ]
        )
        == 0
    ), capsys.readouterr().err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    prov = summary["env_provenance"]
    assert summary["train"]["updates"] == 2 and (prov["package"], prov["env_id"]) == (
        "verifiers",
        "vf-fixture-env",
    )
    assert summary["holdout"]["final"]["tasks"] == 4
    with Ledger(run / "ledger.sqlite") as ledger:
        records = list(ledger.iter_query())
    assert records and all(
        t.provenance["package"] == "verifiers" and t.provenance["kind"] == "single_turn"
        for t in records
    )
