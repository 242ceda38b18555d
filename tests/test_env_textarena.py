"""TextArena's two-player games: tasks, the scripted player, the verifier, a match, and
`taurl train` through the recipe (2 updates)."""

from __future__ import annotations

import asyncio
import json
import random
import sys

import pytest

pytest.importorskip("textarena")

from taurl import envs  # noqa: E402
from taurl.envs import check_env  # noqa: E402
from taurl.envs.core import Task  # noqa: E402
from taurl.envs.multiagent import Seat  # noqa: E402
from taurl.envs.textarena_bridge import (  # noqa: E402
    TextArenaGame,
    TextArenaVerifier,
    listed_moves,
    textarena_expert,
)
from taurl.policy.tokenizer import build_tokenizer  # noqa: E402
from taurl.rollout.budgets import RolloutConfig  # noqa: E402
from taurl.rollout.match import run_match  # noqa: E402
from taurl.rollout.synth import ScriptedEngine, demonstrations  # noqa: E402

CONFIG = {"env_id": "TicTacToe-v0"}


@pytest.fixture(scope="module")
def tok():
    tasks = envs.make_tasks("textarena", "train", 4, seed=0, env_config=CONFIG)
    return build_tokenizer([t.prompt for t in tasks] * 3 + ["[4]", "[0]"] * 5, vocab_size=400)


def test_splits_share_no_game_and_the_prompt_is_the_first_observation():
    ids = {s: {t.task_id for t in envs.make_tasks("textarena", s, 12, seed=0, env_config=CONFIG)}
           for s in ("train", "validation", "holdout")}
    assert not (ids["train"] & ids["validation"] or ids["train"] & ids["holdout"]
                or ids["validation"] & ids["holdout"])
    task = envs.make_tasks("textarena", "train", 1, seed=0, env_config=CONFIG)[0]
    assert "Tic Tac Toe" in task.prompt and listed_moves(task.prompt)


def test_demonstrations_replay_and_observations_are_only_what_is_new(tok):
    tasks = envs.make_tasks("textarena", "train", 6, seed=0, env_config=CONFIG)
    moves = textarena_expert(tasks[0], random.Random(0))
    check_env(envs.make("textarena"), tasks[0], actions=moves)
    cfg = RolloutConfig(max_turns=8, max_action_tokens=8, max_context=4096)
    demos = asyncio.run(demonstrations(tasks, tok, lambda: envs.make("textarena"),
                                       expert=textarena_expert, seed=0, config=cfg))
    verifier = TextArenaVerifier()
    for d, task in zip(demos, tasks, strict=True):
        assert str(d.stop_reason) in ("won", "lost", "draw"), d.stop_reason
        assert verifier(d, task) == d.reward and d.reward in (0.0, 0.5, 1.0)
        text = tok.decode(d.token_ids, skip_special_tokens=False)
        # TextArena repeats a player's whole history; the record holds each part once
        assert text.count("You are Player") == 1


def test_a_textarena_match_leaves_one_record_per_player(tok):
    game = Task("g", "", ("won",), "train", "textarena-v0", {"game_seed": 3})
    seats = {"player_0": Seat.frozen(ScriptedEngine(tok, ["[0]", "[1]", "[2]"])),
             "player_1": Seat.frozen(ScriptedEngine(tok, ["[3]", "[4]"]))}
    r = asyncio.run(run_match(TextArenaGame(), seats, tok, game, seed=0,
                              config=RolloutConfig(max_context=4096, max_action_tokens=8)))
    assert r.returns == {"player_0": 1.0, "player_1": 0.0}
    p0, p1 = r.records
    assert (str(p0.stop_reason), str(p1.stop_reason)) == ("won", "lost")
    first = [m["content"] for m in p1.messages if m["role"] == "user"][0]
    assert "You are Player 1" in first and "[Player 0] [0]" in first  # its view, after p0's move
    assert all("You are Player 1" not in m["content"] for m in p0.messages)


@pytest.mark.slow  # the recipe end to end: ~40 s on a loaded machine
def test_taurl_train_two_updates_on_a_textarena_game(tmp_path, monkeypatch, capsys):
    from taurl.cli.main import main
    from taurl.data.ledger import Ledger

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["train", "--env", "textarena", "--env-config", json.dumps(CONFIG),
                 "--run-dir", "r", "--no-progress", "--demos", "16", "--sft-epochs", "1",
                 "--updates", "2", "--tasks-per-update", "2", "--group-size", "2",
                 "--eval-tasks", "4", "--eval-trials", "1", "--max-turns", "6",
                 "--max-action-tokens", "6", "--max-episode-tokens", "40", "--max-context", "2048",
                 "--vocab-size", "400"]) == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    assert summary["train"]["updates"] == 2 and summary["env"] == "textarena"
    with Ledger(tmp_path / "r/ledger.sqlite") as ledger:
        records = list(ledger.iter_query())
    assert records and all(t.provenance["package"] == "textarena" for t in records)
    assert {t.env_name for t in records} == {"textarena-v0"}
