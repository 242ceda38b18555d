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

Who acted: an engine with ``source`` other than ``"policy"`` (`taurl.rollout.synth.ScriptedEngine`:
``"scripted"``, ``"expert"``) did not sample from a policy, so its actions are recorded
without logprobs or version and the trajectory says ``source``. ``info["provenance"]``
of `reset` is kept in the record as `Trajectory.provenance`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from taurl.data.trajectory import (
    NAME_PATTERN,
    POLICY_SOURCE,
    Segment,
    StopReason,
    ToolReceipt,
    Trajectory,
    Turn,
)
from taurl.envs.core import Env, StepInfo, Task
from taurl.errors import ContractError, Error
from taurl.policy.protocol import Engine, SamplingParams
from taurl.policy.router import routing_key


@dataclass(frozen=True)
class RolloutConfig:
    """Budgets and sampling for the agent loop."""

    max_turns: int = 4  # actions per episode (the env may have a smaller budget)
    max_action_tokens: int = 96  # sampled tokens per action
    max_episode_tokens: int = 384  # sampled tokens per episode, all actions together
    max_observation_tokens: int = 256  # an observation is cut to this many tokens
    observation_keep_tail: int = 4  # ...keeping its last ids (the closing tags)
    max_context: int = 1536  # prompt + actions + observations (never above the model's)
    max_tool_calls: int | None = None  # tool calls per episode (None: no budget)
    temperature: float = 1.0
    top_p: float = 1.0
    generate_timeout_s: float | None = 600.0  # an engine call that takes longer ends the episode as an error (None: wait)
    resume_aborted: bool = False  # an action cut by pause("abort") (a weight update) continues on the new weights


class ChatCodec:
    """Renders chat messages with the tokenizer's template and encodes text once."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None):
        self.tok = tokenizer
        self.tools = tools or None

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        kw: dict[str, Any] = {"tools": self.tools} if self.tools else {}
        return self.tok.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, **kw)

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def split_stops(self, stops: Iterable[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Stops that are one token become stop ids (exact, no decoding); the rest stay strings."""
        ids, strings = [], []
        for s in stops:
            enc = self.encode(s)
            if len(enc) == 1 and self.decode(enc) == s:
                ids.append(enc[0])
            else:
                strings.append(s)
        return tuple(ids), tuple(strings)

    def delta(self, stream_text: str, messages: list[dict], add_generation_prompt: bool) -> str:
        """The text the template adds after `stream_text` to render `messages`."""
        target = self.render(messages, add_generation_prompt)
        if not target.startswith(stream_text):
            raise ContractError("template_prefix", "the chat template does not render the conversation so far as a "
                                "prefix of the next one; observations cannot be appended as a template delta")
        return target[len(stream_text):]


class _Episode:
    """The growing token stream of one episode and its text view."""

    def __init__(self, codec: ChatCodec, messages: list[dict]):
        self.codec = codec
        self.messages = messages
        self.segments: list[Segment] = []
        self.ids: list[int] = []
        self.text = ""

    def append(self, kind: str, ids: list[int], logprobs=None, version=None) -> tuple[int, str]:
        text = self.codec.decode(ids)
        self.segments.append(Segment(kind, tuple(ids), None if logprobs is None else tuple(logprobs), version))
        self.ids.extend(ids)
        self.text += text
        return len(self.segments) - 1, text

    def append_piece(self, ids: list[int], logprobs, version) -> tuple[int, str]:
        """Append one more piece of the current action: into the last segment when the same
        version sampled it, else as a new action segment (one segment per version)."""
        last = self.segments[-1]
        if last.kind != "action" or last.policy_version != version:
            return self.append("action", ids, logprobs, version)
        text = self.codec.decode(ids)
        self.segments[-1] = Segment("action", last.token_ids + tuple(ids), last.logprobs + tuple(logprobs), version)
        self.ids.extend(ids)
        self.text += text
        return len(self.segments) - 1, text

    def add_to_assistant(self, text: str) -> None:
        if self.messages[-1]["role"] != "assistant":
            self.messages.append({"role": "assistant", "content": ""})
        self.messages[-1]["content"] += text


async def run_episode(engine: Engine, env: Env, tokenizer: Any, task: Task, *, seed: int,
                      config: RolloutConfig = RolloutConfig(), group_id: str = "", run_id: str = "",
                      episode_id: str | None = None) -> Trajectory:
    """Run one episode of `env` on `task` with `engine`; always returns a finished record."""
    t_start = time.perf_counter()
    # several engines behind a router: every turn of this episode goes to the same one
    routing_key.set(episode_id or f"{group_id}/{seed}")
    inline = env.observation_style == "inline"
    codec = ChatCodec(tokenizer, None if inline else env.tools)
    messages = ([{"role": "system", "content": env.system_prompt}] if env.system_prompt else [])
    messages.append({"role": "user", "content": task.prompt})
    ep = _Episode(codec, messages)
    ep.append("prompt", codec.encode(codec.render(messages, add_generation_prompt=True)))
    max_context = min(config.max_context, engine.max_context)
    eos_text = codec.decode([tokenizer.eos_token_id]) if tokenizer.eos_token_id is not None else None

    stop_ids, stop_strings = codec.split_stops(env.stop)
    turns: list[Turn] = []
    reward, info = 0.0, {}
    stop: StopReason | None = None
    stop_terminated = False  # the kind of `stop`: termination (True) or truncation
    contract_error: str | None = None  # how the env broke the stop-reason contract
    sampled = tool_calls = 0
    gen_s = env_s = 0.0
    # an engine that is not a policy (a script, an expert) says so: its "logprobs" are not
    # a behaviour policy's and must not be recorded as if they were
    source = getattr(engine, "source", POLICY_SOURCE)
    policy = source == POLICY_SOURCE
    _, reset_info = env.reset(task, seed)
    provenance = reset_info.get("provenance", {}) if isinstance(reset_info, dict) else {}
    provenance = copy.deepcopy(provenance)  # the env may reuse its dict; the record is immutable
    for t in range(config.max_turns):
        budget = min(config.max_action_tokens, config.max_episode_tokens - sampled, max_context - len(ep.ids) - 8)
        if config.max_episode_tokens - sampled <= 0:
            stop = StopReason.MAX_TOKENS
            break
        if budget < 1:
            stop = StopReason.CONTEXT_FULL
            break
        sampling = SamplingParams(temperature=config.temperature, top_p=config.top_p, max_tokens=budget,
                                  stop=stop_strings, stop_token_ids=stop_ids, seed=_derive_seed(seed, t))
        t0 = time.perf_counter()
        pieces: list[tuple[int, str]] = []  # (segment, text) of an action split by version changes
        try:
            gen = await asyncio.wait_for(engine.generate(ep.ids, sampling), config.generate_timeout_s)
            # partial rollout: an action aborted by a weight update keeps its ids (old
            # version) and goes on from them on the new weights, as a new action segment
            # with the new version; the action's token budget counts both pieces
            while config.resume_aborted and gen.finish_reason == "abort" and policy:
                if gen.token_ids:
                    pieces.append(ep.append_piece(gen.token_ids, gen.logprobs, gen.policy_version) if pieces
                                  else ep.append("action", gen.token_ids, gen.logprobs, gen.policy_version))
                sampled += len(gen.token_ids)
                budget -= len(gen.token_ids)
                if budget < 1:  # the budget ran out at the cut: the action ended by length
                    gen = dataclasses.replace(gen, token_ids=[], logprobs=[], finish_reason="length")
                    break
                sampling = dataclasses.replace(sampling, max_tokens=budget,
                                               seed=_derive_seed(seed, t * 1000 + len(pieces) + 1))
                gen = await asyncio.wait_for(engine.generate(ep.ids, sampling), config.generate_timeout_s)
        except Error as e:
            stop, info = StopReason.ERROR, {"error": f"engine: {e}"}
            break
        except asyncio.TimeoutError:  # a hung engine or server: this episode ends, the run goes on
            stop, info = StopReason.ERROR, {"error": f"engine: no completion within generate_timeout_s="
                                                     f"{config.generate_timeout_s:g} s (is the server up?)"}
            break
        gen_s += time.perf_counter() - t0
        sampled += len(gen.token_ids)
        if pieces and gen.token_ids:
            pieces.append(ep.append_piece(gen.token_ids, gen.logprobs, gen.policy_version))
        elif not pieces:
            pieces.append(ep.append("action", gen.token_ids, gen.logprobs if policy else None,
                                    gen.policy_version if policy else None))
        a_idx, action_text = pieces[0][0], "".join(text for _, text in pieces)
        # a sampled end-of-turn token belongs to the stream, not to the message content
        env_text = action_text
        if gen.finish_reason == "eos" and eos_text and action_text.endswith(eos_text):
            env_text = action_text[:-len(eos_text)]
        ep.add_to_assistant(env_text)
        if gen.finish_reason == "abort":
            # the engine cut this action short (pause "abort" around an update): its sampled
            # ids stay in the record, but a cut action is not the model's move, so the env
            # never sees it and the episode ends here, truncated
            turns.append(Turn(index=t, action_text=action_text, action={"kind": "aborted"}, observation_text="",
                              action_segment=a_idx, observation_segment=None, finish_reason="abort",
                              invalid=False, error=None, receipt=None, env_reward=0.0,
                              generate_s=gen.generate_s, env_s=0.0, observation_tokens_dropped=0))
            stop = StopReason.ABORTED
            break

        t0 = time.perf_counter()
        try:
            # envs whose tools do I/O offer `astep`, so other episodes run while a tool runs
            astep = getattr(env, "astep", None)
            obs, r, terminated, truncated, info = await astep(env_text) if astep else env.step(env_text)
        except Exception as e:  # a broken env ends this episode, never the run
            obs, r, terminated, truncated = "", 0.0, False, True
            info = StepInfo(error=f"env.step raised {type(e).__name__}: {e}", stop_reason="error",
                            action={"kind": "error"}, invalid=False)
        dt_env = time.perf_counter() - t0
        env_s += dt_env
        reward += float(r)
        receipt = info.get("receipt")
        tool_calls += receipt is not None
        # inline: the episode is one assistant message, so EOS ends it; messages: EOS only
        # ends this assistant message and the env decides what comes next
        gave_up = inline and gen.finish_reason == "eos"
        ended = terminated or truncated or gave_up
        o_idx, obs_text, dropped = None, "", 0
        if obs and not ended:
            if inline:  # cut the whole text, keeping its last ids (the closing tag)
                obs_ids, dropped = _cut(codec.encode(obs), config.max_observation_tokens,
                                        config.observation_keep_tail)
                message = None
            else:  # cut the message content, then render it as a template delta
                content_ids, dropped = _cut(codec.encode(obs), config.max_observation_tokens, 0)
                message = {"role": info.get("role", "tool"), "content": codec.decode(content_ids)}
                obs_ids = codec.encode(codec.delta(ep.text, ep.messages + [message], True))
            if len(ep.ids) + len(obs_ids) + 8 >= max_context:
                stop, stop_terminated = StopReason.CONTEXT_FULL, False
                ended = True
            else:
                o_idx, obs_text = ep.append("observation", obs_ids)
                if message is None:
                    ep.add_to_assistant(obs_text)
                else:
                    ep.messages.append(message)
        if terminated or truncated:
            stop, stop_terminated, contract_error = _env_stop(info, terminated)
        elif stop is None and gave_up:
            stop, stop_terminated = StopReason.NO_ANSWER, True
        elif stop is None and config.max_tool_calls is not None and tool_calls >= config.max_tool_calls:
            stop = StopReason.TOOL_BUDGET
        error = info.get("error")
        if contract_error:
            error = f"{error}; {contract_error}" if error else contract_error
        turns.append(Turn(index=t, action_text=action_text, action=dict(info.get("action") or {"kind": "unknown"}),
                          observation_text=obs_text,
                          action_segment=a_idx, observation_segment=o_idx, finish_reason=gen.finish_reason,
                          invalid=bool(info.get("invalid", False)), error=error,
                          receipt=receipt if isinstance(receipt, ToolReceipt) else None, env_reward=float(r),
                          generate_s=gen.generate_s, env_s=dt_env, observation_tokens_dropped=dropped))
        if stop is not None:
            break
    if stop is None:
        stop = StopReason.MAX_TURNS

    if ep.messages[-1]["role"] != "assistant":
        ep.add_to_assistant("")  # the stream ends inside an opened assistant turn: close it empty
    closing = codec.delta(ep.text, ep.messages, add_generation_prompt=False)
    if closing:
        ep.append("template", codec.encode(closing))

    components = dict(info.get("reward_components") or {"outcome": reward})
    error = contract_error or info.get("error")
    unexplained = reward - sum(components.values())
    if abs(unexplained) > 1e-9:  # step rewards the final components do not cover
        components["env_steps"] = unexplained
    return Trajectory(
        episode_id=episode_id or uuid.uuid4().hex, run_id=run_id, task_id=task.task_id,
        group_id=group_id or task.task_id, split=task.split, env_name=env.name, env_version=env.version,
        seed=seed, segments=tuple(ep.segments), turns=tuple(turns), messages=tuple(ep.messages),
        terminated=stop_terminated, truncated=not stop_terminated, stop_reason=stop,
        reward=sum(components.values()), reward_components=components,
        verifier_version=str(info.get("verifier_version") or getattr(env, "verifier_version", "")),
        timings={"wall_s": time.perf_counter() - t_start, "generate_s": gen_s, "env_s": env_s},
        metadata={"answers": list(task.answers), "error": error if stop == StopReason.ERROR else None,
                  **{k: v for k, v in task.metadata.items() if k in ("family", "hops")}},
        source=source, provenance=provenance,
    )


def _env_stop(info: StepInfo, terminated: bool) -> tuple[StopReason, bool, str | None]:
    """(reason, terminated, contract violation) of a step where the env ended the episode.

    The env's own reason keeps the env's flag as its kind; one of the loop's reasons must
    have the loop's kind. A violation ends the episode as a truncation by "error".
    """
    default = "answered" if terminated else "error" if info.get("error") else "max_turns"
    name = info.get("stop_reason") or default
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return StopReason.ERROR, False, (f'env contract: info["stop_reason"] {name!r} is not a snake_case name '
                                         "(lowercase letters, digits, '_'); fix the env")
    reason = StopReason(name)
    if reason.kind is not None and reason.is_termination != terminated:
        flag = "terminated" if terminated else "truncated"
        return StopReason.ERROR, False, (f'env contract: info["stop_reason"] {name!r} is one of the loop\'s '
                                         f"{reason.kind}s but the env set {flag}=True; give the env's "
                                         "reason its own name, or set the matching flag")
    return reason, terminated, None


def _cut(ids: list[int], max_tokens: int, keep_tail: int) -> tuple[list[int], int]:
    """Cut `ids` to `max_tokens` in tokens (not characters), keeping the last `keep_tail`."""
    if len(ids) <= max_tokens:
        return ids, 0
    tail = min(keep_tail, max_tokens)
    return ids[:max_tokens - tail] + ids[len(ids) - tail:], len(ids) - max_tokens


def _derive_seed(seed: int, turn: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{turn}".encode(), digest_size=4).digest(), "little")


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    failures: list[tuple[str, str]]  # (task_id, why) for episodes that produced no record


async def run_episodes(engine: Engine, make_env: Callable[[], Env], tokenizer: Any, tasks: list[Task], *,
                       group_size: int = 1, config: RolloutConfig = RolloutConfig(), concurrency: int = 32,
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
                traj = await run_episode(engine, make_env(), tokenizer, task, seed=ep_seed, config=config,
                                         group_id=f"{run_id}:{round_index}:{task.task_id}", run_id=run_id)
            except Exception as e:  # noqa: BLE001 — counted and explained, never fatal
                failures.append((task.task_id, f"{type(e).__name__}: {e}"))
                return
            trajectories.append(traj)
            if on_episode is not None:
                on_episode(traj)

    jobs = [one(task, g, _derive_seed(seed, i * group_size + g)) for i, task in enumerate(tasks) for g in range(group_size)]
    await asyncio.gather(*jobs)
    return RolloutResult(trajectories, failures)
