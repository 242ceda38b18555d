"""tictactoe-v0's numbered board (the legal moves spelled out) and the greedy opponent."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest

from taurl.envs import check_env
from taurl.envs.core import Task
from taurl.envs.games import rules
from taurl.envs.games.tictactoe import (
    TicTacToeGame,
    TicTacToeVerifier,
    tictactoe_env,
    tictactoe_expert,
    tictactoe_tasks,
)


def board_cells(text: str) -> list[str]:
    """The 9 cells of the last board rendered in `text`."""
    board = re.findall(r"\S \S \S / \S \S \S / \S \S \S", text)[-1]
    return board.replace(" / ", " ").split()


def test_a_numbered_board_shows_exactly_the_empty_cells_numbers():
    assert rules.render("x.o.x....", numbered=True) == "x 2 o / 4 x 6 / 7 8 9"
    assert rules.render("x.o.x....") == "x . o / . x . / . . ."
    for seed in range(20):
        rng, board = random.Random(seed), rules.EMPTY
        while rules.outcome(board) is None:
            cells = board_cells(rules.render(board, numbered=True))
            assert [int(c) - 1 for c in cells if c.isdigit()] == rules.legal(board)
            board = rules.play(board, rng.choice(rules.legal(board)))


def test_the_numbered_env_shows_numbers_in_every_observation_and_replays():
    tasks = tictactoe_tasks("train", 12, seed=0, numbered=True)
    plain = tictactoe_tasks("train", 12, seed=0)
    assert [t.task_id for t in tasks] == [t.task_id for t in plain]  # same games, same splits
    for task in tasks:
        board = task.metadata["board"]
        assert [int(c) - 1 for c in board_cells(task.prompt) if c.isdigit()] == rules.legal(board)
    env = tictactoe_env(numbered=True)
    check_env(env, tasks[0], actions=tictactoe_expert(tasks[0], random.Random(0)))
    _, info = env.reset(tasks[1])
    assert info["provenance"]["numbered"] is True
    env.reset(tasks[1])
    cell = rules.legal(tasks[1].metadata["board"])[0]
    obs, *_ = env.step(rules.move_text(cell))
    if obs:  # the game goes on: the answer's board is numbered too
        cells = board_cells(obs)
        assert all(c.isdigit() or c in "xo" for c in cells) and cells[cell] in "xo"
    # the verifier replays a numbered game's moves to the reward the env paid
    for task in tasks:
        env, moves = tictactoe_env(numbered=True), tictactoe_expert(task, random.Random(1), 0.5)
        env.reset(task)
        turns, reward = [], None
        for move in moves:
            turns.append(SimpleNamespace(action_text=move))
            _, reward, done, *_ = env.step(move)
            if done:
                break
        traj = SimpleNamespace(turns=turns, provenance={"max_illegal": 2, "numbered": True})
        assert TicTacToeVerifier()(traj, task) == reward


def test_the_numbered_game_tells_each_role_its_numbered_board():
    game = TicTacToeGame(numbered=True)
    game.reset(Task("g", "", ("won",), "train", "tictactoe-v0", {"opening": rules.EMPTY}))
    assert "1 2 3 / 4 5 6 / 7 8 9" in game.prompt_for("x")
    seen, *_ = game.step("x", "<move>5</move>")
    assert "1 2 3 / 4 x 6 / 7 8 9" in seen["o"]
    again, *_ = game.step("o", "<move>5</move>")  # taken: told so, on the numbered board
    assert "illegal move. 1 2 3 / 4 x 6 / 7 8 9" in again["o"]


def test_greedy_takes_a_win_then_blocks_and_misses_forks():
    assert rules.greedy_moves("xx.oo....") == [2]  # x wins at 3 rather than block o
    assert rules.greedy_moves("oo.x.x...") == [4]  # x to move: wins at 5
    assert rules.greedy_moves("xx.o.....") == [2]  # o to move: blocks at 3
    assert rules.greedy_moves("x........") == rules.legal("x........")  # nothing to see
    assert set(rules.OPPONENTS) >= {"random", "minimax", "greedy"}
    # beatable: optimal play wins some games against it and loses none; it never loses to
    # a uniform random player in a position where one move wins
    wins = 0
    for seed in range(40):
        board = rules.EMPTY
        while rules.outcome(board) is None:
            if rules.to_move(board) == "x":
                move = random.Random(seed * 31 + len(board.replace(".", ""))).choice(
                    rules.best_moves(board))
            else:
                move = rules.opponent_move(board, "greedy", 0.0, seed)
            board = rules.play(board, move)
        assert rules.outcome(board) in ("x", "draw")
        wins += rules.outcome(board) == "x"
    assert wins > 0


@pytest.mark.parametrize("numbered", [False, True])
def test_the_board_is_plain_without_the_option(numbered):
    for task in tictactoe_tasks("validation", 10, seed=0, numbered=numbered):
        cells = board_cells(task.prompt)
        assert ("." in cells) is (not numbered)
        assert any(c.isdigit() for c in cells) is numbered
