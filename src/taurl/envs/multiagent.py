"""Several agents in one episode: the turn-based environment protocol and who plays each role.

    info = env.reset(task, seed)                          # info["to_act"]: the first role
    observations, rewards, terminated, truncated, info = env.step(role, action_text)

A `TurnBasedEnv` declares its ``roles`` (``("x", "o")``, ``("proposer", "solver")``); after
`reset` and after every `step`, ``info["to_act"]`` names the role that acts next. `step`
returns what each role is told of the move (``observations[role]``, text that role reads
before it next acts; a role left out is told nothing), the reward each role earns by it
(``rewards[role]``), and the usual flags, which end the episode for every role.
``info`` is the acting role's `taurl.envs.core.StepInfo` (``action``, ``invalid``, ...);
``info["stop_reasons"][role]`` may give each role its own stop reason when the episode
ends (``won``, ``lost``, ``draw``) and ``info["reward_components"][role]`` its components.

A role's first turn starts from ``env.prompt_for(role)``: the game as that role sees it at
that moment (the board after the moves before it), so a role that moves second starts
from the position it is handed, not from the empty game.

Each role is played by a `Seat` (`taurl.rollout.match.run_match`):

* ``Seat.policy(engine)`` — the trained policy (one engine may sit in every seat: shared
  weights, self-play); its records reach the learner;
* ``Seat.frozen(engine)`` — a frozen version (an engine serving an old checkpoint): its
  records are kept (logprobs and versions as sampled) but marked untrained;
* ``Seat.scripted(fn)`` — a fixed program, ``fn(env, role) -> action text`` (a scripted
  opponent); it reads the env's state and leaves no token record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from taurl.envs.core import Task
from taurl.errors import ConfigError

Program = Callable[[Any, str], str]  # (env, role) -> action text


@runtime_checkable
class TurnBasedEnv(Protocol):
    """An environment where roles take turns (module docstring)."""

    name: str
    version: str
    verifier_version: str
    observation_style: str  # "inline" | "messages", for every role's stream
    stop: tuple[str, ...]
    tools: list[dict[str, Any]]
    roles: tuple[str, ...]

    def system_prompt_for(self, role: str) -> str:
        """The system prompt of `role`'s stream ("" for none)."""
        ...

    def reset(self, task: Task, seed: int | None = None) -> dict[str, Any]:
        """Start the episode; info with "to_act" (and optionally "provenance")."""
        ...

    def prompt_for(self, role: str) -> str:
        """The user message of `role`'s first turn: the episode as `role` sees it now."""
        ...

    def step(
        self, role: str, action: str
    ) -> tuple[dict[str, str], dict[str, float], bool, bool, dict[str, Any]]:
        """`role` acts; (observations, rewards, terminated, truncated, info) as above."""
        ...


SEAT_KINDS = ("policy", "frozen", "program")


@dataclass(frozen=True)
class Seat:
    """Who plays one role: an engine (``policy`` trained, ``frozen`` not) or a ``program``."""

    kind: str
    engine: Any = None  # a taurl.policy.protocol.Engine, for "policy" and "frozen"
    program: Program | None = None

    def __post_init__(self) -> None:
        if self.kind not in SEAT_KINDS:
            raise ConfigError(f"seat kind {self.kind!r} is unknown; use one of {SEAT_KINDS}")
        if (self.kind == "program") != (self.program is not None) or (self.kind != "program") != (
            self.engine is not None
        ):
            raise ConfigError(
                f"a {self.kind!r} seat needs "
                f"{'a program' if self.kind == 'program' else 'an engine'} and nothing else"
            )

    @property
    def trained(self) -> bool:
        """Do this seat's records reach the learner?"""
        return self.kind == "policy"

    @classmethod
    def policy(cls, engine: Any) -> Seat:
        return cls("policy", engine=engine)

    @classmethod
    def frozen(cls, engine: Any) -> Seat:
        return cls("frozen", engine=engine)

    @classmethod
    def scripted(cls, program: Program) -> Seat:
        return cls("program", program=program)
