"""TextArena's two-player games (``pip install textarena==0.7.4``) as taurl environments.

    taurl train --env textarena --env-config '{"env_id": "TicTacToe-v0"}' ...

Two faces, as for `taurl.envs.games.tictactoe`:

* `TextArenaEnv` (registered as ``textarena``): the policy plays one player (the task's);
  the other is a scripted program that plays one of the moves the game lists as available
  (``Available Moves: '[0]', '[4]'``), drawn deterministically from (the task, the
  observation), so the game of a task is fixed by the moves played: the expert plans
  against it, a GRPO group meets one opponent, the verifier replays a record.
* `TextArenaGame`: the `taurl.envs.multiagent.TurnBasedEnv` for
  `taurl.rollout.match.run_match` (self-play, a frozen opponent, a program).

Text: TextArena's own observations, each a new user message (``observation_style =
"messages"``); the first one (the rules and the board) is the task's prompt. A move is what
TextArena reads (``[4]`` for tic-tac-toe). TextArena's rewards (+1 win, −1 loss, 0 draw) are
mapped to taurl's [0, 1] outcome: (r + 1) / 2. Invalid moves are TextArena's to judge (it
warns, then ends the game); a move after which the same player is to act again is marked
invalid in the record.

Tasks: one per (game seed, player); the split is decided by the content (env id, seed,
player), so splits share no game. The expert plays the first listed move (it teaches the
move format, not strategy); games that list no moves need an expert of their own.
"""

from __future__ import annotations

import random
import re
from importlib.metadata import version as package_version
from typing import Any

from taurl.envs.core import Task
from taurl.envs.gym.splits import derive_seed, draw
from taurl.errors import ConfigError, ResetNeeded

NAME = "textarena-v0"  # the env's (and its tasks') name; registered as ``textarena``
DEFAULT_GAME = "TicTacToe-v0"
FRACTIONS = (0.8, 0.1, 0.1)
AVAILABLE = re.compile(r"Available Moves:([^\n]*)")
MOVE = re.compile(r"'([^']+)'")
ROLES = ("player_0", "player_1")


def _ta() -> Any:
    try:
        import textarena
    except ImportError as e:
        raise ConfigError(f"env textarena needs the textarena package ({e}); "
                          "pip install 'taurl[ecosystem]' (or pip install textarena==0.7.4)") from e
    return textarena


def listed_moves(observation: str) -> list[str]:
    """The moves the game's last ``Available Moves:`` line lists ([] when none)."""
    lines = AVAILABLE.findall(observation)
    return MOVE.findall(lines[-1]) if lines else []


def opponent_move(observation: str, key: object) -> str:
    """The scripted player's move: a listed move drawn from ``Random(f"{key}:{observation}")``."""
    moves = listed_moves(observation)
    return random.Random(f"{key}:{observation}").choice(moves) if moves else "[0]"


def outcome(reward: float) -> float:
    """TextArena's +1 / 0 / −1 as a [0, 1] outcome."""
    return (float(reward) + 1.0) / 2.0


class _Game:
    """One TextArena game and the scripted player: the part both faces share."""

    def __init__(self, env_id: str, seed: int, key: object):
        self.env = _ta().make(env_id)
        self.env.reset(num_players=2, seed=seed)
        self.key, self.done = key, False
        self.read: dict[int, str] = {}  # each player's history as TextArena last gave it
        self.rewards: dict[int, float] = {}
        self.reasons: dict[int, str] = {}

    def observe(self) -> tuple[int, str]:
        """(the player to act, what is new to it): TextArena hands a player its whole history
        each time; only the part it has not read yet is new."""
        pid, text = self.env.get_observation()
        old = self.read.get(pid, "")
        self.read[pid] = text
        return pid, text[len(old):] if text.startswith(old) else text

    def act(self, action: str) -> None:
        self.done, _ = self.env.step(action=action)
        if self.done:
            rewards, info = self.env.close()
            self.rewards = {int(p): float(r) for p, r in rewards.items()}
            self.reasons = {int(p): str((info or {}).get(p, {}).get("reason", "")) for p in rewards}

    def until(self, player: int) -> str:
        """Let the scripted player move until `player` is to act (or the game ends); the
        observation `player` has gathered ("" when the game ended). `self.replies` counts
        the scripted moves in between (0: the game gave `player` the move back)."""
        self.replies = 0
        while not self.done:
            pid, obs = self.observe()
            if pid == player:
                return obs
            self.act(opponent_move(obs, self.key))
            self.replies += 1
        return ""


def _stop(reward: float) -> str:
    return "won" if reward > 0 else "lost" if reward < 0 else "draw"


class TextArenaEnv:
    """The single-agent face (module docstring): the task's player against the program."""

    name = NAME
    observation_style, stop, tools, system_prompt = "messages", (), [], ""

    def __init__(self, env_id: str = DEFAULT_GAME, max_turns: int | None = None):
        self.env_id = env_id
        self.version = f"{env_id}@textarena-{package_version('textarena')}"
        self.verifier_version = f"textarena-outcome-1@{package_version('textarena')}"
        self.game: _Game | None = None

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        m = task.metadata
        self.player = int(m["player"])
        self.game = _Game(m["env_id"], int(m["game_seed"]), task.task_id)
        first = self.game.until(self.player)
        return first, {"provenance": {"package": "textarena", "env_id": m["env_id"],
                                      "version": package_version("textarena")}}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.game is None or self.game.done:
            raise ResetNeeded("call reset() first")
        self.game.act(action)
        info: dict[str, Any] = {"action": {"kind": "move", "move": action.strip()[:80]},
                                "invalid": False, "role": "user"}
        obs = self.game.until(self.player)
        if not self.game.done:
            # the same player to act at once: the game refused the move (obs says why)
            info["invalid"] = self.game.replies == 0
            return obs, 0.0, False, False, info
        r = self.game.rewards.get(self.player, 0.0)
        reward = outcome(r)
        return "", reward, True, False, {**info, "stop_reason": _stop(r),
                                          "reward_components": {"outcome": reward},
                                          "verifier_version": self.verifier_version}


def textarena_tasks(split: str, n: int, seed: int = 0, *, player: str = "both",
                    env_config: dict[str, Any] | None = None) -> list[Task]:
    """`n` games of `split`: a game seed and the policy's player (0, 1 or both, drawn)."""
    env_id = (env_config or {}).get("env_id", DEFAULT_GAME)
    if player not in ("0", "1", "both", 0, 1):
        raise ConfigError(f"player must be 0, 1 or 'both', got {player!r}")

    def candidates():
        i = 0
        while True:
            rng = random.Random(derive_seed("textarena", env_id, seed, i))
            p = rng.randrange(2) if player == "both" else int(player)
            yield i, (rng.randrange(10**9), p)
            i += 1

    games = draw(split, n, candidates(), lambda g: f"{env_id}|{g[0]}|{g[1]}", FRACTIONS,
                 distinct=split != "train", max_draws=50 * n + 1000, what=f"{env_id} games")
    tasks = []
    for _, (game_seed, p) in games:
        task_id = f"textarena/{env_id}/{game_seed}/{p}"
        meta = {"env_id": env_id, "game_seed": game_seed, "player": p}
        first = _Game(env_id, game_seed, task_id).until(p)
        tasks.append(Task(task_id, first, ("won",), split, NAME, meta))
    return tasks


def textarena_expert(task: Task, rng: random.Random) -> list[str]:
    """The first listed move every turn, played through a fresh game (module docstring)."""
    m = task.metadata
    game = _Game(m["env_id"], int(m["game_seed"]), task.task_id)
    obs, moves = game.until(int(m["player"])), []
    while not game.done and len(moves) < 50:
        listed = listed_moves(obs)
        moves.append(listed[0] if listed else "[0]")
        game.act(moves[-1])
        obs = game.until(int(m["player"]))
    return moves


class TextArenaVerifier:
    """Replays the recorded moves in a fresh game; the score is the replayed outcome."""

    version = "textarena-replay-1"

    def __call__(self, traj: Any, task: Task) -> float:
        env = TextArenaEnv(task.metadata["env_id"])
        env.reset(task)
        for turn in traj.turns:
            _, reward, terminated, _, _ = env.step(turn.action_text)
            if terminated:
                return float(reward)
        return 0.0


class TextArenaGame:
    """The two-player face (`taurl.envs.multiagent.TurnBasedEnv`): both players are seats."""

    name = NAME
    observation_style, stop, tools = "messages", (), []
    roles = ROLES

    def __init__(self, env_id: str = DEFAULT_GAME):
        self.env_id = env_id
        self.version = f"{env_id}@textarena-{package_version('textarena')}"
        self.verifier_version = f"textarena-outcome-1@{package_version('textarena')}"

    def system_prompt_for(self, role: str) -> str:
        return ""

    def reset(self, task: Task, seed: int | None = None) -> dict[str, Any]:
        self.game = _Game(self.env_id, int(task.metadata.get("game_seed", seed or 0)), task.task_id)
        pid, self.first = self.game.observe()
        self.seen = {ROLES[pid]: self.first}
        return {"to_act": ROLES[pid], "provenance": {"package": "textarena", "env_id": self.env_id}}

    def prompt_for(self, role: str) -> str:
        return self.seen.get(role, "")

    def step(self, role: str, action: str) -> tuple[dict[str, str], dict[str, float], bool, bool,
                                                    dict[str, Any]]:
        self.game.act(action)
        info: dict[str, Any] = {"action": {"kind": "move", "move": action.strip()[:80]},
                                "invalid": False, "role": "user"}
        if self.game.done:
            raw = {ROLES[p]: r for p, r in self.game.rewards.items()}
            rewards = {r: outcome(x) for r, x in raw.items()}
            return {}, rewards, True, False, {
                **info, "to_act": None, "stop_reasons": {r: _stop(x) for r, x in raw.items()},
                "reward_components": {r: {"outcome": x} for r, x in rewards.items()},
                "verifier_version": self.verifier_version}
        pid, obs = self.game.observe()
        nxt = ROLES[pid]
        info["invalid"] = nxt == role
        self.seen[nxt] = obs
        return {nxt: obs}, {}, False, False, {**info, "to_act": nxt}
