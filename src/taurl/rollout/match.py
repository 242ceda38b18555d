"""Multi-agent episodes ("matches"): one token-exact record per engine-played role.

    result = await run_match(env, {"x": Seat.policy(engine), "o": Seat.policy(engine)},
                             tokenizer, task, seed=0)
    result.trained          # the records the learner gets (one per trained role)
    results = await run_matches(TicTacToeGame, seats, tokenizer, tasks, group_size=4)

Each role played by an engine runs the ordinary agent loop (`taurl.rollout.loop.run_episode`)
against a per-role view of the shared env (`_RoleEnv`): its own prompt (the env's
``prompt_for(role)`` when the role first acts), its own sampled ids, logprobs and versions,
and, as observations, what the env told it since it last acted. So every record keeps the
single-agent contract exactly (masks, token-exactness, export, learner), and only adds to
``metadata``: ``role``, ``match_id`` (shared by the roles of one match), ``seat``
("policy" | "frozen") and ``trained``. Programs (scripted opponents) act inside the
coordinator and leave no record. docs/multi-agent.md describes the format.

How turns interleave: a role's `astep` applies its action to the env and then waits until
the env names it to act again (its observation is then ready) or the episode ends (its
final reward). A role whose own loop ends first (a turn or token budget, an engine failure)
leaves the match: the others end truncated with stop reason ``opponent_left``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from taurl.data.trajectory import Trajectory
from taurl.envs.core import Task
from taurl.envs.multiagent import Seat, TurnBasedEnv
from taurl.errors import ConfigError, ResetNeeded
from taurl.rollout.budgets import RolloutConfig
from taurl.rollout.loop import run_episode
from taurl.rollout.seeds import _derive_seed

StepResult = tuple[str, float, bool, bool, dict[str, Any]]
LEFT = "opponent_left"  # stop reason of the roles still playing when another one left


@dataclass(frozen=True)
class MatchResult:
    """What one match left: the engine-played roles' records and each role's return."""

    match_id: str
    records: list[Trajectory]  # every engine-played role's record (trained and frozen)
    returns: dict[str, float]  # every role's total reward, programs included
    failures: list[tuple[str, str]]  # (role, why) for a role whose loop raised

    @property
    def trained(self) -> list[Trajectory]:
        """The records of trained seats: the only ones that reach the learner."""
        return [t for t in self.records if t.metadata.get("trained")]


class _RoleEnv:
    """The single-agent view of one role (`taurl.envs.core.Env`, with `astep`)."""

    def __init__(self, match: _Match, role: str):
        env = match.env
        self.match, self.role = match, role
        self.name, self.version, self.verifier_version = env.name, env.version, env.verifier_version
        self.observation_style, self.stop, self.tools = env.observation_style, env.stop, env.tools
        self.system_prompt = env.system_prompt_for(role)

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return "", {"provenance": dict(self.match.provenance)}

    def step(self, action: str) -> StepResult:
        raise ResetNeeded("a role of a match acts through astep (taurl.rollout.match)")

    async def astep(self, action: str) -> StepResult:
        return await self.match.play(self.role, action)


class _Match:
    """The coordinator: applies actions, plays programs, starts and wakes the roles."""

    def __init__(
        self,
        env: TurnBasedEnv,
        seats: Mapping[str, Seat],
        tokenizer: Any,
        task: Task,
        *,
        seed: int,
        config: RolloutConfig,
        group_id: str,
        run_id: str,
        match_id: str,
    ):
        self.env, self.seats, self.tokenizer, self.task = env, dict(seats), tokenizer, task
        self.seed, self.config, self.run_id, self.match_id = seed, config, run_id, match_id
        self.group_id = group_id or task.task_id
        self.rng = random.Random(f"{seed}:{match_id}")
        self.told: dict[str, list[str]] = {r: [] for r in env.roles}  # observations not yet read
        self.earned: dict[str, float] = dict.fromkeys(env.roles, 0.0)  # reward not yet handed over
        self.returns: dict[str, float] = dict.fromkeys(env.roles, 0.0)
        self.own_info: dict[str, dict[str, Any]] = {}  # each role's last step info
        self.waiting: dict[str, asyncio.Future[StepResult]] = {}
        self.running: dict[str, asyncio.Task[Trajectory]] = {}
        self.to_act: str | None = None
        self.over = False
        self.final: tuple[bool, bool, dict[str, Any]] = (False, True, {"stop_reason": LEFT})
        self.provenance: dict[str, Any] = {}
        self.failures: list[tuple[str, str]] = []

    # -- the flow of the game ------------------------------------------------------------
    def start(self) -> None:
        info = self.env.reset(self.task, self.seed)
        self.provenance = dict(info.get("provenance") or {})
        self.to_act = info.get("to_act")
        self._advance()

    def _apply(self, role: str, action: str) -> tuple[bool, bool, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = self.env.step(role, action)
        for r, text in obs.items():
            if text:
                self.told[r].append(text)
        for r, x in rewards.items():
            self.earned[r] += float(x)
            self.returns[r] += float(x)
        self.own_info[role] = dict(info)
        self.to_act = info.get("to_act")
        return bool(terminated), bool(truncated), info

    def _advance(self) -> None:
        """Play programs while one is to act; start an engine role on its first turn."""
        while not self.over and self.to_act is not None:
            role = self.to_act
            seat = self.seats[role]
            if seat.kind != "program":
                if role not in self.running:
                    self.told[role].clear()  # its prompt shows the game as it is now
                    index = len(self.running)  # roles get seeds in the order they first act
                    self.running[role] = asyncio.ensure_future(self._run_role(role, index))
                return
            terminated, truncated, info = self._apply(role, seat.program(self.env, role))
            if terminated or truncated:
                self._finish(terminated, truncated, info)

    def _hand_over(
        self, role: str, terminated: bool, truncated: bool, final: dict[str, Any] | None
    ) -> StepResult:
        """What `role`'s pending `astep` returns: its observations, its reward, the flags."""
        text = "" if (terminated or truncated) else "".join(self.told[role])
        self.told[role].clear()
        reward, self.earned[role] = self.earned[role], 0.0
        info = dict(self.own_info.get(role) or {"action": {"kind": "unknown"}, "invalid": False})
        for k in ("reward_components", "stop_reasons", "stop_reason", "to_act"):
            info.pop(k, None)  # the episode's end is told below, each role its own part
        if final is not None:
            stops = final.get("stop_reasons") or {}
            comps = final.get("reward_components") or {}
            info["stop_reason"] = (
                stops.get(role) or final.get("stop_reason") or info.get("stop_reason")
            )
            if isinstance(comps.get(role), dict):
                info["reward_components"] = comps[role]
            for k in ("verifier_version", "error"):
                if k in final:
                    info[k] = final[k]
        return text, reward, terminated, truncated, info

    def _finish(self, terminated: bool, truncated: bool, final: dict[str, Any]) -> None:
        self.over, self.final = True, (terminated, truncated, final)
        for role, fut in list(self.waiting.items()):
            if not fut.done():
                fut.set_result(self._hand_over(role, terminated, truncated, final))
        self.waiting.clear()

    async def play(self, role: str, action: str) -> StepResult:
        """`role`'s move; returns when `role` is to act again or the episode is over."""
        if self.over:
            return self._hand_over(role, *self.final)
        terminated, truncated, info = self._apply(role, action)
        if terminated or truncated:
            self._finish(terminated, truncated, info)
            return self._hand_over(role, terminated, truncated, info)
        self._advance()
        if self.over:  # a program's move ended the episode
            return self._hand_over(role, *self.final)
        if self.to_act == role:  # the env gives the same role another move (e.g. a retry)
            return self._hand_over(role, False, False, None)
        fut: asyncio.Future[StepResult] = asyncio.get_running_loop().create_future()
        self.waiting[role] = fut
        self._wake(self.to_act)
        return await fut

    def _wake(self, role: str | None) -> None:
        fut = self.waiting.pop(role, None) if role is not None else None
        if fut is not None and not fut.done():
            fut.set_result(self._hand_over(role, False, False, None))

    async def _run_role(self, role: str, index: int) -> Trajectory:
        seat = self.seats[role]
        task = dataclasses.replace(self.task, prompt=self.env.prompt_for(role))
        try:
            return await run_episode(
                seat.engine,
                _RoleEnv(self, role),
                self.tokenizer,
                task,
                seed=_derive_seed(self.seed, index),
                config=self.config,
                group_id=f"{self.group_id}/{role}",
                run_id=self.run_id,
                episode_id=f"{self.match_id}/{role}",
            )
        finally:
            if not self.over:  # this role's own loop ended (a budget): the others cannot go on
                self._finish(False, True, {"stop_reason": LEFT})

    async def records(self) -> list[Trajectory]:
        """Wait for every started role; its records in the order the roles first acted."""
        done: set[str] = set()
        out: dict[str, Trajectory] = {}
        while set(self.running) - done:
            pending = [t for r, t in self.running.items() if r not in done]
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for role, t in self.running.items():
                if role in done or not t.done():
                    continue
                done.add(role)
                if t.exception() is not None:
                    self.failures.append((role, f"{type(t.exception()).__name__}: {t.exception()}"))
                    continue
                seat = self.seats[role]
                traj = t.result()
                out[role] = dataclasses.replace(
                    traj,
                    metadata={
                        **traj.metadata,
                        "role": role,
                        "match_id": self.match_id,
                        "seat": seat.kind,
                        "trained": seat.trained,
                        "roles": list(self.env.roles),
                    },
                )
        return [out[r] for r in self.running if r in out]


async def run_match(
    env: TurnBasedEnv,
    seats: Mapping[str, Seat],
    tokenizer: Any,
    task: Task,
    *,
    seed: int,
    config: RolloutConfig | None = None,
    group_id: str = "",
    run_id: str = "",
    match_id: str | None = None,
) -> MatchResult:
    """Play one multi-agent episode of `env` on `task` (module docstring).

    seats: one `Seat` per role of ``env.roles``. Records get ``group_id`` ``{group_id}/{role}``
    (default group: the task id), so group estimators compare one role across the matches of
    a task; ``episode_id`` ``{match_id}/{role}``.
    """
    missing = [r for r in env.roles if r not in seats]
    extra = [r for r in seats if r not in env.roles]
    if missing or extra:
        raise ConfigError(
            f"seats must name every role of {env.name} {env.roles} once; "
            f"missing {missing}, unknown {extra}"
        )
    m = _Match(
        env,
        seats,
        tokenizer,
        task,
        seed=seed,
        config=config or RolloutConfig(),
        group_id=group_id,
        run_id=run_id,
        match_id=match_id or uuid.uuid4().hex,
    )
    m.start()
    records = await m.records()
    return MatchResult(m.match_id, records, dict(m.returns), m.failures)


async def run_matches(make_env: Callable[[], TurnBasedEnv], seats: Mapping[str, Seat],
                      tokenizer: Any, tasks: Sequence[Task], *, group_size: int = 1,
                      config: RolloutConfig | None = None, concurrency: int = 32, seed: int = 0,
                      run_id: str = "", round_index: int = 0) -> list[MatchResult]:
    """`group_size` matches per task, at most `concurrency` at once, in task order.

    The matches of one task in this round share a group (``{run_id}:{round}:{task}/{role}``
    per role), so GRPO compares one role across them; ``rae`` needs no group, ``zero_sum``
    pairs the records of each match. Seats are shared by every match (one engine may serve
    them all: self-play).
    """
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, task: Task, g: int) -> MatchResult:
        async with sem:
            return await run_match(make_env(), seats, tokenizer, task,
                                   seed=_derive_seed(seed, i * group_size + g), config=config,
                                   group_id=f"{run_id}:{round_index}:{task.task_id}",
                                   run_id=run_id, match_id=f"{run_id}:{round_index}:{i}:{g}")

    return list(await asyncio.gather(*[one(i, t, g) for i, t in enumerate(tasks)
                                       for g in range(group_size)]))
