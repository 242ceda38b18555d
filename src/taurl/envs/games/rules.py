"""Tic-tac-toe rules, exact minimax and the scripted opponents: pure functions of a board.

A board is a string of 9 cells, row by row, each ``x``, ``o`` or ``.``; x moves first, so the
player to move is x when both have as many marks. Cells are numbered 1..9 in the text the
agent writes (``<move>5</move>``) and 0..8 here.

`value(board)` is the game-theoretic value for the player to move (its sign: win, draw, loss;
a quicker win and a slower loss score higher) by exhaustive minimax (von Neumann 1928;
tic-tac-toe has 5,478 reachable positions, all memoised). `best_moves` are the moves that
keep that value.

The scripted opponent is a deterministic function of (its key, the board): its randomness
comes from ``random.Random(f"{key}:{board}")``. So the game a task describes is fixed by
the task and the moves played, an expert can plan against it open loop, the members of a
GRPO group meet the same opponent, and a verifier can replay a record exactly.
"""

from __future__ import annotations

import functools
import random
import re

from taurl.errors import ConfigError

EMPTY = "." * 9
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
OPPONENTS = ("random", "minimax", "greedy")
MOVE = re.compile(r"<move>\s*([1-9])\s*</move>")


def to_move(board: str) -> str:
    return "x" if board.count("x") == board.count("o") else "o"


def other(role: str) -> str:
    return "o" if role == "x" else "x"


def legal(board: str) -> list[int]:
    return [i for i, c in enumerate(board) if c == "."]


def play(board: str, cell: int) -> str:
    if board[cell] != ".":
        raise ConfigError(f"cell {cell + 1} of {board!r} is taken")
    return board[:cell] + to_move(board) + board[cell + 1 :]


def outcome(board: str) -> str | None:
    """ "x" or "o" (a line of three), "draw" (a full board), None (the game goes on)."""
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return "draw" if "." not in board else None


@functools.cache
def value(board: str) -> int:
    """Minimax value for the player to move: its sign is the game's (+ win, 0 draw, − loss);
    its size prefers the quickest win and the slowest loss (1 + the empty cells at the end)."""
    result = outcome(board)
    if result == "draw":
        return 0
    if result is not None:  # the player who just moved has won: the sooner, the worse
        return -(1 + board.count("."))
    return max(-value(play(board, c)) for c in legal(board))


def best_moves(board: str) -> list[int]:
    """The legal cells whose resulting position keeps the value of `board`, ascending."""
    v = value(board)
    return [c for c in legal(board) if -value(play(board, c)) == v]


def parse_move(text: str) -> int | None:
    """The cell (0..8) of the last ``<move>N</move>`` in `text`, or None."""
    found = MOVE.findall(text)
    return int(found[-1]) - 1 if found else None


def move_text(cell: int) -> str:
    return f"<move>{cell + 1}</move>"


def render(board: str, numbered: bool = False) -> str:
    """``x . o / . x . / . . .``: one token per cell for a small tokenizer. `numbered`: an
    empty cell shows its number instead of ``.`` (``x 2 o / 4 x 6 / 7 8 9``), so the legal
    moves are spelled out where they are, as many game envs list the legal actions."""
    cells = [str(i + 1) if numbered and c == "." else c for i, c in enumerate(board)]
    return " / ".join(" ".join(cells[r * 3 : r * 3 + 3]) for r in range(3))


def greedy_moves(board: str) -> list[int]:
    """One ply of lookahead: the cells that win now; else those that block the other
    player's win now; else every legal cell (it does not see forks)."""
    me, free = to_move(board), legal(board)
    for mark in (me, other(me)):
        hits = [c for c in free if outcome(board[:c] + mark + board[c + 1 :]) == mark]
        if hits:
            return hits
    return free


def opponent_move(board: str, kind: str, p_random: float, key: object) -> int:
    """The scripted opponent's cell: uniform over legal moves for ``random``; for
    ``minimax`` an optimal move (ties drawn), for ``greedy`` a `greedy_moves` cell (ties
    drawn), except with probability `p_random` a uniform legal move. Deterministic in
    (key, board) (module docstring)."""
    if kind not in OPPONENTS:
        raise ConfigError(f"opponent {kind!r} is unknown; use one of {OPPONENTS}")
    if not 0.0 <= p_random <= 1.0:
        raise ConfigError(f"opponent_p_random must be in [0, 1], got {p_random!r}")
    rng = random.Random(f"{key}:{board}")
    if kind == "random" or rng.random() < p_random:
        return rng.choice(legal(board))
    return rng.choice(best_moves(board) if kind == "minimax" else greedy_moves(board))
