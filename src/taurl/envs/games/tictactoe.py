"""tictactoe-v0: tic-tac-toe with a verifier, against a scripted opponent or in self-play.

Two faces of one game (`taurl.envs.games.rules`):

* `TicTacToeEnv` — the registered single-agent env: the policy plays the task's role (x or
  o) and the task's scripted opponent (``random``, or ``minimax`` that plays a uniform move
  with probability ``opponent_p_random``) answers inside `step`. This is what ``taurl
  train`` trains (configs/tictactoe.yaml).
* `TicTacToeGame` — the two-role `taurl.envs.multiagent.TurnBasedEnv` for
  `taurl.rollout.match.run_match`: both roles played by engines (self-play with shared
  weights, a frozen version) or one by `scripted_opponent` (a program).

Text: the prompt shows the board (``x . o / . . . / . . .``; with ``numbered`` each empty
cell shows its number, ``x 2 o / 4 5 6 / 7 8 9``) in ``<information>``; a move is
``<move>N</move>`` (cells 1..9, row by row; the engine stops at ``</move>``); the answer is
the opponent's move and the board, inline. A move that is unreadable or on a taken cell is
invalid: the player is told so and tries again; its ``max_illegal``-th invalid move
forfeits the game. Reward (the verifier's score): win 1, draw 0.5, loss or forfeit 0.

Tasks: an opening of 0..2 random moves, the trained role, and the opponent with its seed;
the opponent's first move is already on the board when it moves first. A task's split is
decided by its content ``(role, opening, opponent, opponent seed)`` (`taurl.envs.gym.splits`),
so the splits share no game; they do share openings (there are only 82 of at most two
moves), and differ in the opponent's seeded choices.
"""

from __future__ import annotations

import random
from typing import Any

from taurl.envs.core import Task
from taurl.envs.games.rules import (
    EMPTY,
    best_moves,
    legal,
    move_text,
    opponent_move,
    other,
    outcome,
    parse_move,
    play,
    render,
    to_move,
)
from taurl.envs.gym.splits import derive_seed, draw
from taurl.errors import ConfigError, ResetNeeded

NAME, VERSION, VERIFIER_VERSION = "tictactoe-v0", "1", "tictactoe-replay-1"
FRACTIONS = (0.8, 0.1, 0.1)
STOP = ("</move>",)
SYSTEM_PROMPT = (
    "Play tic-tac-toe. Cells are numbered 1 to 9 row by row. "
    "Move with <move>N</move> on an empty cell."
)
WIN, DRAW, LOSS = 1.0, 0.5, 0.0


def prompt_of(role: str, board: str, numbered: bool = False) -> str:
    return f"Tic-tac-toe. You play {role}.\n<information>{render(board, numbered)}</information>"


def _score(result: str, role: str) -> tuple[float, str]:
    if result == "draw":
        return DRAW, "draw"
    return (WIN, "won") if result == role else (LOSS, "lost")


class TicTacToeEnv:
    """The single-agent face (module docstring): the task's role against its opponent."""

    name, version, verifier_version = NAME, VERSION, VERIFIER_VERSION
    observation_style, stop, tools = "inline", STOP, []
    system_prompt = SYSTEM_PROMPT

    def __init__(self, max_illegal: int = 2, numbered: bool = False):
        if isinstance(max_illegal, bool) or not isinstance(max_illegal, int) or max_illegal < 1:
            raise ConfigError(f"max_illegal must be an integer >= 1, got {max_illegal!r}")
        self.max_illegal, self.numbered = max_illegal, bool(numbered)
        self.board: str | None = None

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        m = task.metadata
        self.task, self.board, self.role, self.illegal = task, m["board"], m["role"], 0
        provenance = {"max_illegal": self.max_illegal, "opponent": m["opponent"]}
        if self.numbered:
            provenance["numbered"] = True
        return "", {"provenance": provenance}

    def _opponent(self, board: str) -> int:
        m = self.task.metadata
        return opponent_move(
            board, m["opponent"], float(m["opponent_p_random"]), m["opponent_seed"]
        )

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.board is None:
            raise ResetNeeded("call reset() first")
        cell = parse_move(action)
        if cell is None or self.board[cell] != ".":
            self.illegal += 1
            info = {"action": {"kind": "illegal", "cell": cell}, "invalid": True}
            if self.illegal >= self.max_illegal:
                self.board = None
                return "", LOSS, True, False, {**info, "stop_reason": "forfeit", **_done(LOSS)}
            return (
                f"<information>illegal move. {render(self.board, self.numbered)}</information>",
                0.0,
                False,
                False,
                info,
            )
        info = {"action": {"kind": "move", "cell": cell + 1}, "invalid": False}
        board = play(self.board, cell)
        if (result := outcome(board)) is None:
            reply = self._opponent(board)
            board = play(board, reply)
            result = outcome(board)
            if result is None:
                self.board = board
                return (
                    f"<information>{other(self.role)} {reply + 1}. "
                    f"{render(board, self.numbered)}</information>",
                    0.0,
                    False,
                    False,
                    info,
                )
        reward, reason = _score(result, self.role)
        self.board = None
        return "", reward, True, False, {**info, "stop_reason": reason, **_done(reward)}


def _done(reward: float) -> dict[str, Any]:
    return {"reward_components": {"outcome": reward}, "verifier_version": VERIFIER_VERSION}


class TicTacToeGame:
    """The two-role face (`taurl.envs.multiagent.TurnBasedEnv`): x and o take turns."""

    name, version, verifier_version = NAME, VERSION, VERIFIER_VERSION
    observation_style, stop, tools = "inline", STOP, []
    roles = ("x", "o")

    def __init__(self, max_illegal: int = 2, illegal_penalty: float = 0.0,
                 numbered: bool = False):
        if not illegal_penalty >= 0:
            raise ConfigError(f"illegal_penalty must be >= 0, got {illegal_penalty!r}")
        self.max_illegal = max_illegal
        # a step reward of -illegal_penalty on each invalid move (0: the outcome alone): in
        # self-play a forfeit is also the opponent's win, so without it an invalid move is
        # told apart from a lost game only through the match's end
        self.illegal_penalty = float(illegal_penalty)
        self.numbered = bool(numbered)
        self.board = EMPTY

    def system_prompt_for(self, role: str) -> str:
        return SYSTEM_PROMPT

    def reset(self, task: Task, seed: int | None = None) -> dict[str, Any]:
        self.board = task.metadata.get("opening", EMPTY)
        self.illegal = dict.fromkeys(self.roles, 0)
        return {"to_act": to_move(self.board), "provenance": {"max_illegal": self.max_illegal}}

    def prompt_for(self, role: str) -> str:
        return prompt_of(role, self.board, self.numbered)

    def step(
        self, role: str, action: str
    ) -> tuple[dict[str, str], dict[str, float], bool, bool, dict[str, Any]]:
        if role != to_move(self.board):
            raise ConfigError(f"{role} moved out of turn on {self.board!r}")
        cell = parse_move(action)
        if cell is None or self.board[cell] != ".":
            self.illegal[role] += 1
            info = {"action": {"kind": "illegal", "cell": cell}, "invalid": True, "to_act": role}
            fine = -self.illegal_penalty
            if self.illegal[role] >= self.max_illegal:
                return (
                    {},
                    {role: LOSS + fine, other(role): WIN},
                    True,
                    False,
                    {
                        **info,
                        "to_act": None,
                        **_ends(
                            {role: "forfeit", other(role): "won"}, {role: LOSS, other(role): WIN}
                        ),
                    },
                )
            text = f"<information>illegal move. {render(self.board, self.numbered)}</information>"
            return {role: text}, ({role: fine} if fine else {}), False, False, info
        self.board = play(self.board, cell)
        info = {"action": {"kind": "move", "cell": cell + 1}, "invalid": False}
        result = outcome(self.board)
        if result is None:
            seen = (f"<information>{role} {cell + 1}. "
                    f"{render(self.board, self.numbered)}</information>")
            return {other(role): seen}, {}, False, False, {**info, "to_act": other(role)}
        scores = {r: _score(result, r) for r in self.roles}
        rewards = {r: s for r, (s, _) in scores.items()}
        return (
            {},
            rewards,
            True,
            False,
            {**info, "to_act": None, **_ends({r: why for r, (_, why) in scores.items()}, rewards)},
        )


def _ends(reasons: dict[str, str], rewards: dict[str, float]) -> dict[str, Any]:
    return {
        "stop_reasons": reasons,
        "verifier_version": VERIFIER_VERSION,
        "reward_components": {r: {"outcome": x} for r, x in rewards.items()},
    }


def scripted_opponent(kind: str = "minimax", p_random: float = 0.0, key: object = 0):
    """A program for `taurl.envs.multiagent.Seat.scripted`: reads the game's board."""

    def program(env: TicTacToeGame, role: str) -> str:
        return move_text(opponent_move(env.board, kind, p_random, key))

    return program


def tictactoe_env(
    max_illegal: int = 2, max_turns: int | None = None, numbered: bool = False
) -> TicTacToeEnv:
    """The registered factory; `max_turns` (the recipe's, passed to every env) is the loop's
    budget: a game ends within 5 moves and ``max_illegal - 1`` retries."""
    return TicTacToeEnv(max_illegal=max_illegal, numbered=numbered)


def tictactoe_tasks(
    split: str,
    n: int,
    seed: int = 0,
    *,
    role: str = "both",
    opening_moves: tuple[int, int] | list[int] = (0, 2),
    opponent: str = "minimax",
    opponent_p_random: float = 0.5,
    numbered: bool = False,
) -> list[Task]:
    """`n` games of `split` (module docstring). role: "x", "o" or "both" (drawn per task);
    `numbered`: the prompt's board shows the empty cells' numbers (the env's option)."""
    if role not in ("x", "o", "both"):
        raise ConfigError(f"role must be 'x', 'o' or 'both', got {role!r}")
    lo, hi = (int(x) for x in opening_moves)
    if not 0 <= lo <= hi <= 4:
        raise ConfigError(
            f"opening_moves must be (lo, hi) with 0 <= lo <= hi <= 4, got {opening_moves!r}"
        )
    opponent_move(EMPTY, opponent, opponent_p_random, 0)  # checks the opponent's options

    def candidates():
        i = 0
        while True:
            rng = random.Random(derive_seed("tictactoe", seed, i))
            board = EMPTY
            for _ in range(rng.randint(lo, hi)):
                board = play(board, rng.choice(legal(board)))
            r = rng.choice("xo") if role == "both" else role
            yield i, (r, board, rng.randrange(10**9))
            i += 1

    games = draw(
        split,
        n,
        candidates(),
        lambda g: f"{g[0]}|{g[1]}|{opponent}|{opponent_p_random}|{g[2]}",
        FRACTIONS,
        distinct=split != "train",
        max_draws=50 * n + 1000,
        what="tic-tac-toe games",
    )
    tasks = []
    for _, (r, opening, key) in games:
        board = opening
        if to_move(board) != r:  # the opponent moves first
            board = play(board, opponent_move(board, opponent, opponent_p_random, key))
        meta = {
            "role": r,
            "opening": opening,
            "board": board,
            "opponent": opponent,
            "opponent_p_random": opponent_p_random,
            "opponent_seed": key,
        }
        tasks.append(
            Task(
                f"tictactoe/{r}/{opening}/{key}",
                prompt_of(r, board, numbered),
                ("won",),
                split,
                NAME,
                meta,
            )
        )
    return tasks


def tictactoe_expert(task: Task, rng: random.Random, p_random: float = 0.0) -> list[str]:
    """Optimal play (the lowest optimal cell) against the task's opponent, simulated ahead;
    with probability `p_random` per move a uniform legal move instead (a quality knob)."""
    m = task.metadata
    board, moves = m["board"], []
    while outcome(board) is None:
        cell = rng.choice(legal(board)) if rng.random() < p_random else best_moves(board)[0]
        moves.append(move_text(cell))
        board = play(board, cell)
        if outcome(board) is None:
            board = play(
                board,
                opponent_move(
                    board, m["opponent"], float(m["opponent_p_random"]), m["opponent_seed"]
                ),
            )
    return moves


class TicTacToeVerifier:
    """Replays the recorded moves against the task's opponent on a fresh board; the score
    is the replayed result (1 / 0.5 / 0), never the training reward."""

    version = VERIFIER_VERSION

    def __call__(self, traj: Any, task: Task) -> float:
        env = TicTacToeEnv(
            max_illegal=int(traj.provenance.get("max_illegal", 2)),
            numbered=bool(traj.provenance.get("numbered", False)),
        )
        env.reset(task)
        for turn in traj.turns:
            _, reward, terminated, _, _ = env.step(turn.action_text)
            if terminated:
                return float(reward)
        return 0.0  # the game did not finish (a turn or token budget): no result
