"""The agent loop: token in, token out (docs/design.md#token-exact).

One episode, read top to bottom:

1. the task prompt is rendered once with the chat template → prompt ids (mask 0);
2. the engine samples an action from the concatenated ids; its ids, logprobs and policy
   version are appended exactly as they came (mask 1);
3. the environment answers; the observation is encoded once and appended (mask 0):
   *inline* envs (Search-R1) append it to the same assistant message, *messages* envs
   append a new chat message as a template delta (render[base, msg] minus render[base]);
4. repeat until the env terminates or truncates, or a budget runs out; then the
   template's end-of-turn tokens close the stream (kind "template", mask 0).

History is never re-encoded: the text view (`messages`) is built from the decoded
segments, so ``decode(ids) == chat_template(messages)`` holds by construction, and the
tests check it. Every failure inside an episode (engine, env, tool) ends that episode
with a stop reason and an error text; it never ends the run.

How an episode ends (`taurl.data.trajectory.StopReason`, an open set): the loop's own budgets
give its own reasons; when the env ends the episode, its ``info["stop_reason"]`` is kept
as given (``"goal"``, ``"fell"``, …) with the env's terminated/truncated flag as its kind
(default ``"answered"`` / ``"max_turns"``, or ``"error"`` with ``info["error"]``). An env
that breaks this contract — a name that is not snake_case, or one of the loop's reasons
with the other kind — gets a record too: truncated, ``"error"``, the violation in words.

Partial rollouts (``RolloutConfig.resume_aborted``, the async schedule's ``interrupt:
interrupt``): an action the engine aborts at a weight update is not ended; its ids stay
(old version) and sampling goes on from them on the new weights, appended as a further
action segment with the new version (`_Episode.append_piece`: one segment per version; the
turn names the first, `taurl.credit.tokens` gives it the rest). The action's token budget
counts every piece. A stop string split across the cut is not seen (stop ids are).

The outcome: an env may carry ``taurl_outcome(traj, task) -> float`` (`taurl.train`'s
``reward=`` sets it); the finished record's ``outcome`` component is then its value, the
env's other components (constraint, shaping, step rewards) are kept as they are.

Who acted: an engine with ``source`` other than ``"policy"`` (`taurl.rollout.synth.ScriptedEngine`:
``"scripted"``, ``"expert"``) did not sample from a policy, so its actions are recorded
without logprobs or version and the trajectory says ``source``. ``info["provenance"]``
of `reset` is kept in the record as `Trajectory.provenance`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import numbers
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from taurl.data.trajectory import (
    NAME_PATTERN,
    POLICY_SOURCE,
    StopReason,
    ToolReceipt,
    Trajectory,
    Turn,
    sampling_record,
)
from taurl.envs.core import Env, StepInfo, Task, episode_env
from taurl.errors import ContractError, Error
from taurl.policy.protocol import Engine, Generation, SamplingParams
from taurl.policy.router import routing_key
from taurl.rollout import compaction
from taurl.rollout.budgets import RolloutConfig
from taurl.rollout.seeds import _derive_seed
from taurl.rollout.stream import ChatCodec, _cut, _Episode

DEFAULTS = RolloutConfig()  # frozen: one instance serves every call without a config


@dataclass
class _State:
    """What one episode has gathered besides its token stream: turns, reward, budgets, stop."""

    ep: _Episode
    config: RolloutConfig
    seed: int
    max_context: int
    stop_ids: tuple[int, ...]
    stop_strings: tuple[str, ...]
    eos_text: str | None
    inline: bool  # the episode is one assistant message (Search-R1) rather than a chat
    source: str  # who acts: "policy", or an engine that is not one ("scripted", "expert")
    provenance: dict
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    info: dict = field(default_factory=dict)  # the last step's info (final reward components)
    stop: StopReason | None = None
    terminated: bool = False  # the kind of `stop`: termination (True) or truncation
    contract_error: str | None = None  # how the env broke the stop-reason contract
    sampled: int = 0  # tokens sampled so far, all actions together
    tool_calls: int = 0
    gen_s: float = 0.0
    env_s: float = 0.0

    @property
    def policy(self) -> bool:
        # an engine that is not a policy says so: its "logprobs" are not a behaviour
        # policy's and must not be recorded as if they were
        return self.source == POLICY_SOURCE


@dataclass(frozen=True)
class _Action:
    """One sampled action: the engine's answer, its first segment and its text."""

    gen: Generation
    segment: int
    text: str  # as sampled (a sampled end-of-turn token included)
    env_text: str  # what the env sees: the text without that end-of-turn token


async def run_episode(engine: Engine, env: Env, tokenizer: Any, task: Task, *, seed: int,
                      config: RolloutConfig = DEFAULTS, group_id: str = "", run_id: str = "",
                      episode_id: str | None = None) -> Trajectory:
    """Run one episode of `env` on `task` with `engine`; always returns a finished record.

    Each turn: sample an action (`_sample`), let the env observe it (`_observe`); then close
    the stream and build the record (`_close`). A step that ends the episode sets its stop.
    """
    t_start = time.perf_counter()
    # several engines behind a router: every turn of this episode goes to the same one
    routing_key.set(episode_id or f"{group_id}/{seed}")
    st = _start(engine, env, tokenizer, task, seed, config)
    for t in range(config.max_turns if st.stop is None else 0):
        if compaction.due(st) and (await compaction.compact(engine, env, task, st, t)
                                   or st.stop is not None):
            break
        action = await _sample(engine, st, t)
        if action is None:
            break
        await _observe(env, st, t, action)
        if st.stop is not None:
            break
    return _close(st, env, task, seed, group_id=group_id, run_id=run_id, episode_id=episode_id,
                  wall_s=time.perf_counter() - t_start)


def _start(engine: Engine, env: Env, tokenizer: Any, task: Task, seed: int,
           config: RolloutConfig) -> _State:
    """Reset the env and render the prompt: the stream starts with the prompt ids (mask 0)."""
    inline = env.observation_style == "inline"
    codec = ChatCodec(tokenizer, None if inline else env.tools)
    messages = ([{"role": "system", "content": env.system_prompt}] if env.system_prompt else [])
    messages.append({"role": "user", "content": task.prompt})
    ep = _Episode(codec, messages)
    ep.append("prompt", codec.encode(codec.render(messages, add_generation_prompt=True)))
    eos_text = (codec.decode([tokenizer.eos_token_id]) if tokenizer.eos_token_id is not None
                else None)
    stop_ids, stop_strings = codec.split_stops(env.stop)
    reset_error = None
    try:
        _, reset_info = env.reset(task, seed)
    except Exception as e:
        # a broken env ends this episode (a record with the error), never the run
        reset_info, reset_error = {}, f"env.reset raised {type(e).__name__}: {e}"
    provenance = reset_info.get("provenance", {}) if isinstance(reset_info, dict) else {}
    provenance = copy.deepcopy(provenance)  # the env may reuse its dict; the record is immutable
    st = _State(ep, config, seed, min(config.max_context, engine.max_context), stop_ids,
                stop_strings, eos_text, inline, getattr(engine, "source", POLICY_SOURCE),
                provenance)
    if reset_error is not None:
        st.stop, st.info = StopReason.ERROR, {"error": reset_error}
    return st


async def _sample(engine: Engine, st: _State, t: int) -> _Action | None:
    """Sample turn `t`'s action and append it (mask 1); None when the episode ends here
    (a budget ran out, the engine failed or aborted the action: `st.stop` says which)."""
    cfg, ep = st.config, st.ep
    budget = min(cfg.max_action_tokens, cfg.max_episode_tokens - st.sampled,
                 st.max_context - len(ep.ids) - 8)
    if cfg.max_episode_tokens - st.sampled <= 0:
        st.stop = StopReason.MAX_TOKENS
        return None
    if budget < 1:
        st.stop = StopReason.CONTEXT_FULL
        return None
    sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=budget,
                              stop=st.stop_strings, stop_token_ids=st.stop_ids,
                              seed=_derive_seed(st.seed, t))
    t0 = time.perf_counter()
    pieces: list[tuple[int, str]] = []  # (segment, text) of an action split by version changes
    try:
        gen = await _generate(engine, st, t, sampling, budget, pieces)
    except Error as e:
        st.stop, st.info = StopReason.ERROR, {"error": f"engine: {e}"}
        return None
    except asyncio.TimeoutError:  # a hung engine or server: this episode ends, the run goes on
        st.stop, st.info = StopReason.ERROR, {
            "error": "engine: no completion within "
                     f"generate_timeout_s={cfg.generate_timeout_s:g} s (is the server up?)"}
        return None
    st.gen_s += time.perf_counter() - t0
    st.sampled += len(gen.token_ids)
    if pieces and gen.token_ids:
        pieces.append(ep.append_piece(gen.token_ids, gen.logprobs, gen.policy_version))
    elif not pieces:
        pieces.append(ep.append("action", gen.token_ids, gen.logprobs if st.policy else None,
                                gen.policy_version if st.policy else None))
    a_idx, action_text = pieces[0][0], "".join(text for _, text in pieces)
    # a sampled end-of-turn token belongs to the stream, not to the message content
    env_text = action_text
    if gen.finish_reason == "eos" and st.eos_text and action_text.endswith(st.eos_text):
        env_text = action_text[:-len(st.eos_text)]
    ep.add_to_assistant(env_text)
    if gen.finish_reason == "abort":
        # the engine cut this action short (pause "abort" around an update): its sampled
        # ids stay in the record, but a cut action is not the model's move, so the env
        # never sees it and the episode ends here, truncated
        st.turns.append(Turn(index=len(st.turns), action_text=action_text,
                             action={"kind": "aborted"}, observation_text="",
                             action_segment=a_idx, observation_segment=None, finish_reason="abort",
                             invalid=False, error=None, receipt=None, env_reward=0.0,
                             generate_s=gen.generate_s, env_s=0.0, observation_tokens_dropped=0))
        st.stop = StopReason.ABORTED
        return None
    return _Action(gen, a_idx, action_text, env_text)


async def _generate(engine: Engine, st: _State, t: int, sampling: SamplingParams, budget: int,
                    pieces: list[tuple[int, str]]) -> Generation:
    """One completion; a partial rollout's aborted pieces are appended to `pieces` on the way.

    An action aborted by a weight update keeps its ids (old version) and goes on from them on
    the new weights, as a new action segment with the new version; the action's token budget
    counts every piece.
    """
    cfg, ep = st.config, st.ep
    gen = await asyncio.wait_for(engine.generate(ep.ids, sampling), cfg.generate_timeout_s)
    resumes = 0  # continuations so far: each samples with a seed of its own, no other turn's
    while cfg.resume_aborted and gen.finish_reason == "abort" and st.policy:
        resumes += 1
        if gen.token_ids:
            pieces.append(ep.append_piece(gen.token_ids, gen.logprobs, gen.policy_version) if pieces
                          else ep.append("action", gen.token_ids, gen.logprobs, gen.policy_version))
        st.sampled += len(gen.token_ids)
        budget -= len(gen.token_ids)
        if budget < 1:  # the budget ran out at the cut: the action ended by length
            return dataclasses.replace(gen, token_ids=[], logprobs=[], finish_reason="length")
        sampling = dataclasses.replace(sampling, max_tokens=budget,
                                       seed=_derive_seed(st.seed, t, resumes))
        gen = await asyncio.wait_for(engine.generate(ep.ids, sampling), cfg.generate_timeout_s)
    return gen


async def _observe(env: Env, st: _State, t: int, action: _Action) -> None:
    """The env answers `action`; its observation is appended (mask 0) unless the episode
    ends; the turn is recorded, and `st.stop` set when the env or a budget ends the episode."""
    cfg, gen = st.config, action.gen
    t0 = time.perf_counter()
    try:
        # envs whose tools do I/O offer `astep`, so other episodes run while a tool runs
        astep = getattr(env, "astep", None)
        obs, r, terminated, truncated, info = (await astep(action.env_text) if astep
                                               else env.step(action.env_text))
        broken = _step_problem(r, info)
    except Exception as e:  # a broken env ends this episode, never the run
        broken = f"env.step raised {type(e).__name__}: {e}"
    if broken is not None:
        obs, r, terminated, truncated = "", 0.0, False, True
        info = StepInfo(error=broken, stop_reason="error", action={"kind": "error"}, invalid=False)
    dt_env = time.perf_counter() - t0
    st.env_s += dt_env
    st.reward += float(r)
    st.info = info
    receipt = info.get("receipt")
    st.tool_calls += receipt is not None
    # inline: the episode is one assistant message, so EOS ends it; messages: EOS only
    # ends this assistant message and the env decides what comes next
    gave_up = st.inline and gen.finish_reason == "eos"
    o_idx, obs_text, dropped = None, "", 0
    if obs and not (terminated or truncated or gave_up):
        o_idx, obs_text, dropped = _append_observation(st, obs, info)
    if terminated or truncated:
        st.stop, st.terminated, st.contract_error = _env_stop(info, terminated)
    elif st.stop is None and gave_up:
        st.stop, st.terminated = StopReason.NO_ANSWER, True
    elif st.stop is None and cfg.max_tool_calls is not None and st.tool_calls >= cfg.max_tool_calls:
        st.stop = StopReason.TOOL_BUDGET
    error = info.get("error")
    if st.contract_error:
        error = f"{error}; {st.contract_error}" if error else st.contract_error
    st.turns.append(Turn(index=len(st.turns), action_text=action.text,
                         action=dict(info.get("action") or {"kind": "unknown"}),
                         observation_text=obs_text,
                         action_segment=action.segment, observation_segment=o_idx,
                         finish_reason=gen.finish_reason,
                         invalid=bool(info.get("invalid", False)), error=error,
                         receipt=receipt if isinstance(receipt, ToolReceipt) else None,
                         env_reward=float(r), generate_s=gen.generate_s, env_s=dt_env,
                         observation_tokens_dropped=dropped,
                         # the EOS-cut text the env saw, for a replay to give it the same
                         env_text=action.env_text if action.env_text != action.text else None))


def _append_observation(st: _State, obs: str, info: StepInfo) -> tuple[int | None, str, int]:
    """Encode the observation once and append it: (segment, text, tokens cut), or (None, "", n)
    with `st.stop` CONTEXT_FULL when it would not fit in the model's context."""
    cfg, ep, codec = st.config, st.ep, st.ep.codec
    if st.inline:  # cut the whole text, keeping its last ids (the closing tag)
        obs_ids, dropped = _cut(codec.encode(obs), cfg.max_observation_tokens,
                                cfg.observation_keep_tail)
        message = None
    else:  # cut the message content, then render it as a template delta
        content_ids, dropped = _cut(codec.encode(obs), cfg.max_observation_tokens, 0)
        message = {"role": info.get("role", "tool"), "content": codec.decode(content_ids)}
        try:
            obs_ids = codec.encode(codec.delta(ep.text, ep.messages + [message], True))
        except ContractError:  # the template re-renders history (Qwen3's <think>): a new stream
            return (*compaction.rewrite_stream(st, message), dropped)
    if len(ep.ids) + len(obs_ids) + 8 >= st.max_context:
        st.stop, st.terminated = StopReason.CONTEXT_FULL, False
        return None, "", dropped
    o_idx, obs_text = ep.append("observation", obs_ids)
    if message is None:
        ep.add_to_assistant(obs_text)
    else:
        ep.messages.append(message)
    return o_idx, obs_text, dropped


def _close(st: _State, env: Env, task: Task, seed: int, *, group_id: str, run_id: str,
           episode_id: str | None, wall_s: float) -> Trajectory:
    """Close the stream with the template's end-of-turn tokens (mask 0) and build the record."""
    ep = st.ep
    stop = st.stop if st.stop is not None else StopReason.MAX_TURNS
    ep.close_stream()
    info = st.info
    components = dict(info.get("reward_components") or {"outcome": st.reward})
    error = st.contract_error or info.get("error")
    unexplained = st.reward - sum(components.values())
    if abs(unexplained) > 1e-9:  # step rewards the final components do not cover
        components["env_steps"] = unexplained
    traj = Trajectory(
        episode_id=episode_id or uuid.uuid4().hex, run_id=run_id, task_id=task.task_id,
        group_id=group_id or task.task_id, split=task.split, env_name=env.name,
        env_version=env.version, seed=seed, segments=tuple(ep.segments), turns=tuple(st.turns),
        messages=tuple(ep.all_messages),
        terminated=st.terminated, truncated=not st.terminated, stop_reason=stop,
        reward=sum(components.values()), reward_components=components,
        verifier_version=str(info.get("verifier_version") or getattr(env, "verifier_version", "")),
        timings={"wall_s": wall_s, "generate_s": st.gen_s, "env_s": st.env_s},
        metadata={"answers": list(task.answers),
                  "error": error if stop == StopReason.ERROR else None,
                  "sampling": sampling_record(st.config.temperature, st.config.top_p),
                  **{k: v for k, v in task.metadata.items() if k in ("family", "hops")}},
        source=st.source, provenance=st.provenance, stream_starts=tuple(ep.starts),
    )
    outcome = getattr(env, "taurl_outcome", None)
    return traj if outcome is None else _rescored(traj, task, outcome)


def _rescored(traj: Trajectory, task: Task,
              outcome: Callable[[Trajectory, Task], float]) -> Trajectory:
    """The record with its outcome component replaced by ``outcome(traj, task)`` (`taurl.train`'s
    ``reward=``); the env's constraint and shaping components stay, and the reward is their sum."""
    components = {**traj.reward_components, "outcome": outcome(traj, task)}
    return dataclasses.replace(traj, reward=sum(components.values()), reward_components=components,
                               verifier_version=str(getattr(outcome, "version", "") or "python"))


def _step_problem(reward: Any, info: Any) -> str | None:
    """How a step's reward or info breaks the Env protocol (None: they keep it). The episode
    then ends as an error with this text, instead of the run with a raw TypeError."""
    if not _finite(reward):
        return (f"env contract: step returned reward {reward!r} ({type(reward).__name__}); it must "
                "be a finite number (int or float); fix the env's step")
    if not isinstance(info, dict):
        return (f"env contract: step returned info of type {type(info).__name__}; it must be a "
                "dict (a taurl.envs.StepInfo); fix the env's step")
    parts = info.get("reward_components")
    if parts is not None and not (isinstance(parts, dict) and all(map(_finite, parts.values()))):
        return (f'env contract: info["reward_components"] {parts!r} must be a dict of finite '
                "numbers; fix the env's step")
    return None


def _finite(x: Any) -> bool:
    """A real number (Python or numpy scalar, not a bool) that is finite."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _env_stop(info: StepInfo, terminated: bool) -> tuple[StopReason, bool, str | None]:
    """(reason, terminated, contract violation) of a step where the env ended the episode.

    The env's own reason keeps the env's flag as its kind; one of the loop's reasons must
    have the loop's kind. A violation ends the episode as a truncation by "error".
    """
    default = "answered" if terminated else "error" if info.get("error") else "max_turns"
    name = info.get("stop_reason") or default
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return StopReason.ERROR, False, (f'env contract: info["stop_reason"] {name!r} is not a '
                                         "snake_case name (lowercase letters, digits, '_'); fix "
                                         "the env")
    reason = StopReason(name)
    if reason.kind is not None and reason.is_termination != terminated:
        flag = "terminated" if terminated else "truncated"
        return StopReason.ERROR, False, (f'env contract: info["stop_reason"] {name!r} is one of '
                                         f"the loop's {reason.kind}s but the env set {flag}=True; "
                                         "give the env's reason its own name, or set the matching "
                                         "flag")
    return reason, terminated, None


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    failures: list[tuple[str, str]]  # (task_id, why) for episodes that produced no record


async def run_episodes(engine: Engine, make_env: Callable[[], Env], tokenizer: Any,
                       tasks: list[Task], *,
                       group_size: int = 1, config: RolloutConfig = DEFAULTS, concurrency: int = 32,
                       seed: int = 0, run_id: str = "", round_index: int = 0,
                       on_episode: Callable[[Trajectory], None] | None = None) -> RolloutResult:
    """Run `group_size` episodes per task, at most `concurrency` at once.

    Episodes of the same task in this round share a group_id (for group-relative credit).
    A failure that prevents a record (e.g. the env cannot even be built) is counted in
    `failures` with its reason; the other episodes go on.
    """
    sem = asyncio.Semaphore(concurrency)
    trajectories: list[Trajectory] = []
    failures: list[tuple[str, str]] = []

    async def one(task: Task, g: int, ep_seed: int) -> None:
        async with sem:
            try:
                with episode_env(make_env) as env:  # closed after the episode (taurl.envs.core)
                    traj = await run_episode(engine, env, tokenizer, task, seed=ep_seed,
                                             config=config, run_id=run_id,
                                             group_id=f"{run_id}:{round_index}:{task.task_id}")
            except Exception as e:  # noqa: BLE001 — counted and explained, never fatal
                failures.append((task.task_id, f"{type(e).__name__}: {e}"))
                return
            trajectories.append(traj)
            if on_episode is not None:
                on_episode(traj)

    jobs = [one(task, g, _derive_seed(seed, i * group_size + g))
            for i, task in enumerate(tasks) for g in range(group_size)]
    await asyncio.gather(*jobs)
    return RolloutResult(trajectories, failures)
