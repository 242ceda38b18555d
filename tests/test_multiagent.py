"""Multi-agent episodes: tic-tac-toe matches, one token-exact record per engine-played role."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import numpy as np
import pytest
import torch

from taurl import envs
from taurl.credit import TurnBatch, zero_sum
from taurl.data.trajectory import validate_trajectory
from taurl.envs import check_env
from taurl.envs.core import Task
from taurl.envs.games import rules
from taurl.envs.games.tictactoe import (
    SYSTEM_PROMPT,
    TicTacToeEnv,
    TicTacToeGame,
    TicTacToeVerifier,
    prompt_of,
    scripted_opponent,
    tictactoe_expert,
    tictactoe_tasks,
)
from taurl.envs.multiagent import Seat
from taurl.errors import ConfigError
from taurl.policy.engine import LocalEngine
from taurl.policy.model import build_default_policy
from taurl.policy.tokenizer import build_tokenizer
from taurl.rollout.budgets import RolloutConfig
from taurl.rollout.match import run_match, run_matches
from taurl.rollout.synth import ScriptedEngine, demonstrations
from taurl.train.sft import train_sft

EMPTY_GAME = Task("g", "", ("won",), "train", "tictactoe-v0", {"opening": rules.EMPTY})


class RecordingEngine:
    """Wraps an engine and keeps every (prompt_ids, generation) it served."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[list[int], object]] = []

    @property
    def version(self):
        return self.inner.version

    @property
    def max_context(self):
        return self.inner.max_context

    async def generate(self, prompt_ids, sampling):
        gen = await self.inner.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), gen))
        return gen


@pytest.fixture(scope="module")
def tok():
    texts = [SYSTEM_PROMPT, prompt_of("x", "x.o......"), "<move>1</move><information>o 5. x . o"]
    return build_tokenizer(texts * 5, vocab_size=300)


def moves(tok, *cells):
    return ScriptedEngine(tok, [rules.move_text(c - 1) for c in cells])


def test_turns_interleave_and_each_role_reads_only_its_own_stream(tok):
    # x: 1, 2, 3 wins; o: 4, then 1 (taken: illegal, o tries again), then 5
    r = asyncio.run(
        run_match(
            TicTacToeGame(),
            {"x": Seat.frozen(moves(tok, 1, 2, 3)), "o": Seat.frozen(moves(tok, 4, 1, 5))},
            tok,
            EMPTY_GAME,
            seed=0,
            match_id="m",
        )
    )
    assert r.returns == {"x": 1.0, "o": 0.0} and not r.failures
    x, o = r.records
    assert [t.metadata["role"] for t in r.records] == ["x", "o"]
    assert [t.observation_text for t in x.turns] == [
        "<information>o 4. x . . / o . . / . . .</information>",
        "<information>o 5. x x . / o o . / . . .</information>",
        "",
    ]
    assert [t.observation_text for t in o.turns] == [
        "<information>x 2. x x . / o . . / . . .</information>",
        "<information>illegal move. x x . / o . . / . . .</information>",
        "",
    ]
    assert [t.invalid for t in o.turns] == [False, True, False]
    # o starts from the board it was handed (x's first move on it)
    assert (
        "You play o.\n<information>x . . / . . . / . . .</information>" in o.messages[1]["content"]
    )
    assert (x.reward, str(x.stop_reason), o.reward, str(o.stop_reason)) == (1.0, "won", 0.0, "lost")
    assert x.metadata["match_id"] == o.metadata["match_id"] == "m"
    assert (x.episode_id, x.group_id, o.group_id) == ("m/x", "g/x", "g/o")
    assert r.trained == []  # frozen seats: kept, never trained
    for t in r.records:
        validate_trajectory(t)


def test_a_program_seat_leaves_no_record_and_plays_inside_the_match(tok):
    # x is minimax (key 3): 7, then 8, 5 (a fork), 2; o's fixed moves 4, 9, 3 lose
    r = asyncio.run(
        run_match(
            TicTacToeGame(),
            {
                "x": Seat.scripted(scripted_opponent("minimax", key=3)),
                "o": Seat.policy(moves(tok, 4, 9, 3)),
            },
            tok,
            EMPTY_GAME,
            seed=0,
        )
    )
    (o,) = r.records
    assert o.metadata["role"] == "o" and r.trained == r.records
    assert [t.observation_text for t in o.turns] == [
        "<information>x 8. . . . / o . . / x x .</information>",
        "<information>x 5. . . . / o x . / x x o</information>",
        "",
    ]
    assert r.returns == {"x": 1.0, "o": 0.0} and str(o.stop_reason) == "lost"


def test_a_role_that_leaves_ends_the_match_for_the_others(tok):
    # o's own loop ends after one turn (max_turns=1): x cannot go on, truncated
    cfg = RolloutConfig(max_turns=1)
    r = asyncio.run(
        run_match(
            TicTacToeGame(),
            {"x": Seat.frozen(moves(tok, 1, 2, 3)), "o": Seat.frozen(moves(tok, 4, 5))},
            tok,
            EMPTY_GAME,
            seed=0,
            config=cfg,
        )
    )
    x, o = r.records
    assert str(x.stop_reason) == "max_turns" and x.truncated  # x's own turn budget, first
    assert str(o.stop_reason) in ("max_turns", "opponent_left") and o.truncated


def test_seats_must_name_every_role():
    with pytest.raises(ConfigError, match="missing"):
        asyncio.run(
            run_match(
                TicTacToeGame(), {"x": Seat.scripted(scripted_opponent())}, None, EMPTY_GAME, seed=0
            )
        )
    with pytest.raises(ConfigError, match="engine"):
        Seat("policy")


def test_tictactoe_env_keeps_the_env_contract_and_the_verifier_replays_the_reward(tok):
    tasks = envs.make_tasks("tictactoe-v0", "train", 30, seed=0)
    check_env(
        envs.make("tictactoe-v0"), tasks[0], actions=tictactoe_expert(tasks[0], random.Random(0))
    )
    demos = asyncio.run(
        demonstrations(
            tasks,
            tok,
            lambda: envs.make("tictactoe-v0"),
            expert=tictactoe_expert,
            seed=0,
            config=RolloutConfig(max_turns=6, max_action_tokens=24),
        )
    )
    v = TicTacToeVerifier()
    for d, task in zip(demos, tasks, strict=True):
        assert v(d, task) == d.reward
        assert (
            d.reward >= 0.5 or rules.value(task.metadata["board"]) < 0
        )  # optimal play: no avoidable loss
    # a record of illegal moves is a forfeit, replayed as such
    bad = asyncio.run(
        demonstrations(
            tasks[:1],
            tok,
            lambda: envs.make("tictactoe-v0"),
            expert=lambda t, rng: ["<move>0</move>"] * 3,
            seed=0,
        )
    )[0]
    assert str(bad.stop_reason) == "forfeit" and v(bad, tasks[0]) == 0.0 == bad.reward


def test_tictactoe_splits_share_no_game():
    keys = {
        s: {t.task_id for t in tictactoe_tasks(s, 60, seed=0)}
        for s in ("train", "validation", "holdout")
    }
    assert not (
        keys["train"] & keys["validation"]
        or keys["train"] & keys["holdout"]
        or keys["validation"] & keys["holdout"]
    )
    with pytest.raises(ConfigError, match="opponent"):
        tictactoe_tasks("train", 1, opponent="alphago")


def test_minimax_opponent_never_loses_to_random_play():
    for seed in range(30):
        rng, board = random.Random(seed), rules.EMPTY
        while rules.outcome(board) is None:
            move = (
                rng.choice(rules.legal(board))
                if rules.to_move(board) == "x"
                else rules.opponent_move(board, "minimax", 0.0, seed)
            )
            board = rules.play(board, move)
        assert rules.outcome(board) in ("o", "draw")


# -- self-play with a real policy: token-exact records for both roles -------------------------


@pytest.fixture(scope="module")
def selfplay(tmp_path_factory):
    tasks = tictactoe_tasks("train", 64, seed=0, opponent_p_random=1.0)
    path = tmp_path_factory.mktemp("ttt")
    texts = (
        [t.prompt for t in tasks]
        + [SYSTEM_PROMPT] * 5
        + [rules.move_text(c) for c in range(9)] * 20
    )
    model, tok = build_default_policy(texts, path / "v0", size="tiny", vocab_size=512, seed=0)
    cfg = RolloutConfig(max_turns=8, max_action_tokens=10, max_episode_tokens=80, max_context=512)
    demos = asyncio.run(
        demonstrations(
            tasks,
            tok,
            lambda: TicTacToeEnv(),
            expert=tictactoe_expert,
            expert_options={"p_random": 0.3},
            seed=0,
            config=cfg,
        )
    )
    torch.manual_seed(0)
    train_sft(model, demos, epochs=8, batch_size=16, lr=5e-3, pad_id=tok.pad_token_id)
    engine = RecordingEngine(LocalEngine(model, tok, version=1, seed=0))
    games = [
        Task(f"g{i}", "", ("won",), "train", "tictactoe-v0", {"opening": t.metadata["opening"]})
        for i, t in enumerate(tasks[:12])
    ]

    async def play():
        # a lenient referee (4 illegal moves to forfeit): a barely trained policy still
        # plays games where both roles act
        return await asyncio.gather(
            *[
                run_match(
                    TicTacToeGame(max_illegal=4),
                    {"x": Seat.policy(engine), "o": Seat.policy(engine)},
                    tok,
                    g,
                    seed=i,
                    config=cfg,
                    match_id=f"m{i}",
                )
                for i, g in enumerate(games)
            ]
        )

    return asyncio.run(play()), engine.calls, tok, model


def test_selfplay_records_of_both_roles_are_token_exact(selfplay):
    results, calls, tok, _ = selfplay
    trajs = [t for r in results for t in r.trained]
    roles = {t.metadata["role"] for t in trajs}
    assert roles == {"x", "o"}, roles
    assert any(len(t.turns) > 1 for t in trajs)  # some games lasted beyond a move
    by_prefix: dict[tuple, list] = {}
    for prompt, gen in calls:
        by_prefix.setdefault(tuple(prompt), []).append(gen)
    for tr in trajs:
        validate_trajectory(tr)
        role = tr.metadata["role"]
        assert tr.source == "policy" and tr.policy_versions == [1]
        # each role's rows decode to its own rendering, which names its own role
        rendered = tok.apply_chat_template(list(tr.messages), tokenize=False)
        assert tok.decode(tr.token_ids, skip_special_tokens=False) == rendered
        assert f"You play {role}." in rendered and f"You play {rules.other(role)}." not in rendered
        # the mask is 1 exactly on ids the engine sampled, with the logprobs it returned
        pos, expected = 0, []
        for seg in tr.segments:
            if seg.kind == "action":
                served = [(g.token_ids, g.logprobs) for g in by_prefix[tuple(tr.token_ids[:pos])]]
                assert (list(seg.token_ids), list(seg.logprobs)) in served
            expected += [seg.mask] * len(seg.token_ids)
            pos += len(seg.token_ids)
        assert tr.action_mask == expected
    # every sampled id is in exactly one role's record
    assert sum(len(g.token_ids) for _, g in calls) == sum(sum(t.action_mask) for t in trajs)


def test_selfplay_batch_carries_roles_and_matches_for_zero_sum_credit(selfplay):
    results, _, _, _ = selfplay
    full = [t for r in results if len(r.trained) == 2 for t in r.trained]
    assert full, "no match where both roles acted"
    batch = TurnBatch.from_trajectories(full)
    assert set(batch.roles) == {"x", "o"} and len(set(batch.match_ids)) == len(full) // 2
    adv = zero_sum(batch).advantages[:, 0]
    per_match: dict[str, float] = {}
    for m, a in zip(batch.match_ids, adv, strict=True):
        per_match[m] = per_match.get(m, 0.0) + a
    assert np.allclose(list(per_match.values()), 0.0)


@pytest.mark.parametrize("estimator", ["zero_sum", "rae"])
def test_selfplay_records_of_both_roles_train_the_shared_policy(selfplay, estimator, one_thread):
    """Both roles' records go through the unchanged learner: two updates of one policy."""
    import copy

    from taurl.train.learner import Learner, LearnerConfig

    results, _, tok, model = selfplay
    policy = copy.deepcopy(model)
    before = [p.detach().clone() for p in policy.parameters()]
    learner = Learner(policy, LearnerConfig(estimator=estimator, lr=1e-3), pad_id=tok.pad_token_id)
    halves = (results[: len(results) // 2], results[len(results) // 2:])
    for half in halves:
        metrics = learner.update([t for r in half for t in r.trained], version=1)
        assert np.isfinite(metrics["learn/loss"]) and metrics["learn/adv_abs_max"] > 0
    changed = sum(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    assert changed > 0
    if estimator == "rae":  # one running baseline per (env, role), kept across the two updates
        assert set(learner.estimator.baselines) == {("tictactoe-v0", "x"), ("tictactoe-v0", "o")}


def test_run_matches_groups_one_role_across_the_matches_of_a_task(tok):
    tasks = [dataclasses.replace(EMPTY_GAME, task_id=f"t{i}") for i in range(2)]
    seats = {"x": Seat.scripted(scripted_opponent("random", key=1)),
             "o": Seat.scripted(scripted_opponent("minimax", key=2))}
    results = asyncio.run(run_matches(TicTacToeGame, seats, tok, tasks, group_size=3, run_id="r"))
    assert len(results) == 6 and all(r.records == [] for r in results)  # programs only
    assert [r.match_id for r in results[:3]] == ["r:0:0:0", "r:0:0:1", "r:0:0:2"]
    # minimax o never loses to random x
    assert all(r.returns["o"] >= 0.5 for r in results)
    ttt = asyncio.run(run_matches(TicTacToeGame, {"x": Seat.policy(moves(tok, 1, 2, 3)),
                                                  "o": seats["o"]}, tok, tasks[:1], group_size=1,
                                  run_id="r"))
    assert ttt[0].trained[0].group_id == "r:0:t0/x"


def test_match_records_round_trip_through_the_ledger_and_the_export(selfplay, tmp_path):
    """The format change is metadata only: the ledger and the JSONL export keep role and match."""
    import json

    from taurl.data.export import export_jsonl
    from taurl.data.ledger import Ledger

    results, _, _, _ = selfplay
    trajs = [t for r in results for t in r.trained]
    with Ledger(tmp_path / "a.sqlite") as ledger:
        assert ledger.append_many(trajs).ok
        export_jsonl(ledger, tmp_path / "out.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    with Ledger(tmp_path / "b.sqlite") as again:
        assert again.append_many(rows).ok
        back = {t.episode_id: t for t in again.iter_query()}
    for t in trajs:
        assert back[t.episode_id] == t
        assert back[t.episode_id].metadata["role"] == t.metadata["role"]
        assert back[t.episode_id].metadata["match_id"] == t.metadata["match_id"]


def test_the_illegal_penalty_is_a_step_reward_of_the_player_who_moved_illegally():
    game = TicTacToeGame(max_illegal=2, illegal_penalty=0.5)
    game.reset(EMPTY_GAME)
    assert game.step("x", "<move>1</move>")[1] == {}
    _, rewards, done, _, info = game.step("o", "<move>1</move>")  # taken: o is fined
    assert rewards == {"o": -0.5} and not done and info["to_act"] == "o"
    _, rewards, done, _, _ = game.step("o", "no move")  # the second: o forfeits, fined again
    assert done and rewards == {"o": -0.5, "x": 1.0}
    plain = TicTacToeGame(max_illegal=2)
    plain.reset(EMPTY_GAME)
    assert plain.step("x", "nothing")[1] == {}  # no penalty: an invalid move earns nothing
    with pytest.raises(ConfigError):
        TicTacToeGame(illegal_penalty=-1.0)
