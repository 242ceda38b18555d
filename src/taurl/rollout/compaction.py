"""Context management in the agent loop: compaction that starts a new token stream.

An episode longer than its context (`RolloutConfig.max_context`) is not cut off: before a
turn, when the stream holds `CompactionConfig.trigger` of the context (or the next action
would not fit), the loop compacts. The current stream is closed (the template's end-of-turn
ids, mask 0); a new stream begins whose prompt is the compacted conversation, rendered once
with the chat template and recorded as a ``prompt`` segment (mask 0); the record says where
and why (`taurl.data.streams.StreamStart`, reason ``"compaction"``). Sampled ids are never
re-encoded: they stay in the stream that sampled them, token-exact; what the new prompt
shows of them is text, read as a prompt.

Policies (``CompactionConfig.policy``):

=========  ==================================================================================
none       no compaction: a full context ends the episode (``context_full``, a truncation)
drop       the task prompt and the last `keep_turns` turns (their actions and observations)
truncate   the task prompt and every turn, observations before the last `keep_turns` cut to
           `truncate_tokens` tokens
summarize  the policy itself writes a summary first: a request (``summary_request``, mask 0)
           is appended to the stream and the policy samples up to `summary_tokens` ids (an
           action, a turn whose action is ``{"kind": "summary", "trained": ...}``); the new
           prompt is the task prompt, the summary, and the last `keep_turns` turns.
           ``summary: trained`` trains it as the episode's action it is; ``masked`` keeps it
           off the loss (`taurl.train.chains.untrained_keep`). An engine that is not a policy
           (an expert's script) is not asked: the loop writes its summary (`written_summary`)
env        the env's hook ``compact_prompt(task) -> str``: a new user message that states
           where the episode stands (FrozenLake: the map and the current cell)
=========  ==================================================================================

A chat template that rewrites history (Qwen3's drops earlier ``<think>`` blocks when a new
user message follows) cannot have an observation appended as a template delta: the loop
then begins a new stream whose prompt is the whole conversation rendered once with the
observation (`rewrite_stream`, reason ``"template_rewrite"``), instead of re-encoding the
sampled history into the old one.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any, Protocol

from taurl.data.trajectory import StopReason, Turn
from taurl.errors import Error
from taurl.policy.protocol import Generation, SamplingParams
from taurl.rollout.options import CompactionConfig
from taurl.rollout.seeds import _derive_seed
from taurl.rollout.stream import _cut

if TYPE_CHECKING:
    from taurl.rollout.budgets import RolloutConfig
    from taurl.rollout.stream import _Episode

SUMMARY_SEED_SALT = 7919  # a summary's sampling seed differs from the turn's action seed


class CompactionState(Protocol):
    """What compaction reads and writes of an episode in progress: the agent loop's episode
    state implements it (`taurl.rollout.loop`), so this module depends on the record it
    declares, not on the loop's private state."""

    ep: _Episode  # the token stream, its codec and segments
    config: RolloutConfig
    seed: int
    max_context: int
    eos_text: str | None
    inline: bool  # the episode is one assistant message rather than a chat
    turns: list[Turn]
    info: dict
    stop: StopReason | None
    terminated: bool
    sampled: int  # tokens sampled so far
    gen_s: float

    @property
    def policy(self) -> bool: ...  # the engine is a policy (its logprobs are a behaviour's)


def due(st: CompactionState) -> bool:
    """Compact before the next turn: the stream holds `trigger` of the context, or the next
    action and an answer as long as the longest so far (summarize: or the summary request and
    the summary) would not fit; and the stream holds a turn to compact away."""
    c, ep = st.config.compaction, st.ep
    if not c.on or not ep.turns_in_stream:
        return False
    answer = max((len(s.token_ids) for s in ep.segments if s.kind == "observation"), default=0)
    if c.policy == "summarize":  # after the next turn, room for the request and the summary too
        answer += len(ep.codec.encode(c.summary_request)) + 8 + c.summary_tokens
    return (len(ep.ids) >= c.trigger * st.max_context
            or len(ep.ids) + st.config.max_action_tokens + answer + 8 >= st.max_context)


async def compact(engine: Any, env: Any, task: Any, st: CompactionState, t: int) -> None:
    """Close the stream and begin a new one with the compacted conversation as its prompt;
    `st.stop` is set when that fails (an engine error, a prompt that still does not fit, an
    env hook or a chat template that raises: the episode ends with its record, an error, as
    a raising ``env.step`` does, never the run)."""
    try:
        await _compact(engine, env, task, st, t)
    except Exception as e:  # noqa: BLE001 — any failure of the user's hook or template
        why = f"compaction ({st.config.compaction.policy}) raised {type(e).__name__}: {e}"
        st.stop, st.terminated, st.info = StopReason.ERROR, False, {"error": why}


async def _compact(engine: Any, env: Any, task: Any, st: CompactionState, t: int) -> None:
    c, ep = st.config.compaction, st.ep
    # the kept turns are read before a summary is asked for: its request and answer are not
    # an exchange of the episode (messages: the request would be the "last turn")
    kept = [] if c.policy == "env" else _kept_turns(st, c)
    summary = ""
    if c.policy == "summarize":
        summary = await _summarize(engine, st, t)
        if st.stop is not None:
            return
    hook = getattr(env, "compact_prompt", None)
    if c.policy == "env" and hook is None:
        st.stop, st.info = StopReason.ERROR, {"error": "compaction policy env: "
                                                       f"{type(env).__name__} has no "
                                                       "compact_prompt(task) hook; use drop, "
                                                       "truncate or summarize"}
        return
    user = hook(task) if c.policy == "env" else ep.header[-1]["content"]
    if not isinstance(user, str):
        raise TypeError(f"{type(env).__name__}.compact_prompt(task) returned "
                        f"{type(user).__name__}; it returns the new user message as a str")
    if summary:
        user = f"{user}\n{summary}"
    messages = [*ep.header[:-1], {"role": "user", "content": user}]
    if st.inline:  # the kept turns open the assistant message, as the loop appends them
        ep.new_stream(messages, "compaction", prefix="".join(a + o for a, o in kept))
    else:
        ep.new_stream(messages + [m for a, o in kept for m in (a, o)], "compaction")
    if len(ep.ids) + st.config.max_action_tokens + 8 > st.max_context:
        st.stop, st.terminated = StopReason.CONTEXT_FULL, False


def _kept_turns(st: CompactionState, c: CompactionConfig) -> list[tuple[Any, Any]]:
    """(action, observation) of the env turns the new prompt keeps: text (inline) or messages.
    ``truncate`` keeps them all, the older observations cut; the others keep the last few."""
    turns = [t for t in st.turns if t.action.get("kind") != "summary"]
    if st.inline:
        pairs: list[tuple[Any, Any]] = [(t.action_text, t.observation_text) for t in turns]
    else:
        pairs = st.ep.exchanges()
    keep = c.keep_turns
    if c.policy != "truncate":
        return pairs[len(pairs) - keep:] if keep else []
    out = []
    for i, (a, o) in enumerate(pairs):
        if i < len(pairs) - keep:
            o = _shorten(st, o, c.truncate_tokens)
        out.append((a, o))
    return out


def _shorten(st: CompactionState, obs: Any, n: int) -> Any:
    codec = st.ep.codec
    if isinstance(obs, dict):
        return {**obs, "content": codec.decode(_cut(codec.encode(obs["content"]), n, 0)[0])}
    # inline: keep the closing tag (the last ids) so the text still parses as an observation
    m = re.match(r"(\s*<\w+>)(.*?)(</\w+>\s*)$", obs, re.DOTALL)
    if m is None:
        return codec.decode(_cut(codec.encode(obs), n, 0)[0])
    return m.group(1) + codec.decode(_cut(codec.encode(m.group(2)), n, 0)[0]) + m.group(3)


async def _summarize(engine: Any, st: CompactionState, t: int) -> str:
    """The policy writes a summary in the current stream: the request (mask 0), then its
    sampled ids (a summary turn). Returns the summary's text ('' when it does not fit).

    Only a policy is asked: an engine that is not one (a `ScriptedEngine` playing an
    expert's moves) answers each call with its next env move, so a request would spend a
    move on the summary and shift every later one (FrozenLake demonstrations walked into
    holes). For it the loop writes the summary itself (`written_summary`), recorded as the
    summary turn it stands for: demonstrations stay the expert's walk, and they still show
    the policy a request and an answer to imitate, which skipping compaction would not
    (their episodes would then end context_full)."""
    c, ep, cfg = st.config.compaction, st.ep, st.config
    if (len(ep.ids) + len(ep.codec.encode(c.summary_request)) + 16 + c.summary_tokens
            > st.max_context):
        return ""  # no room left to ask: the compaction goes on without a summary
    if st.inline:
        o_idx, _ = ep.append("observation", ep.codec.encode(f"\n{c.summary_request}\n"))
        ep.add_to_assistant(ep.codec.decode(ep.segments[o_idx].token_ids))
    else:  # the stream ends in an opened assistant turn (the generation prompt): it closes empty
        ep.add_to_assistant("")
        message = {"role": "user", "content": c.summary_request}
        ep.append("observation",
                  ep.codec.encode(ep.codec.delta(ep.text, ep.messages + [message], True)))
        ep.messages.append(message)
    budget = min(c.summary_tokens, st.max_context - len(ep.ids) - 8,
                 cfg.max_episode_tokens - st.sampled)
    if budget < 1:
        return ""
    if st.policy:
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=budget,
                                  seed=_derive_seed(st.seed, t, SUMMARY_SEED_SALT))
        try:
            gen = await asyncio.wait_for(engine.generate(ep.ids, sampling), cfg.generate_timeout_s)
        except (Error, asyncio.TimeoutError) as e:
            why = f"engine (summary): {e or type(e).__name__}"
            st.stop, st.info = StopReason.ERROR, {"error": why}
            return ""
    else:  # a script or an expert plays env moves only: asking it would spend one (docstring)
        ids = written_summary(st, budget)
        gen = Generation(ids, [0.0] * len(ids), "stop", 0)
    st.sampled += len(gen.token_ids)
    st.gen_s += gen.generate_s
    a_idx, text = ep.append("action", gen.token_ids, gen.logprobs if st.policy else None,
                            gen.policy_version if st.policy else None)
    content = text  # a sampled end-of-turn token belongs to the stream, not to the message
    if gen.finish_reason == "eos" and st.eos_text and text.endswith(st.eos_text):
        content = text[:-len(st.eos_text)]
    ep.add_to_assistant(content)
    # a turn of its own (its own index), as sampled; the next action is the turn after it
    st.turns.append(Turn(index=len(st.turns), action_text=text,
                         action={"kind": "summary", "trained": c.summary == "trained"},
                         observation_text="", action_segment=a_idx, observation_segment=None,
                         finish_reason=gen.finish_reason, generate_s=gen.generate_s))
    return content.strip()


def written_summary(st: CompactionState, budget: int) -> list[int]:
    """The summary of an engine that is not a policy: the last observation (where the episode
    stands, e.g. FrozenLake's cell and its neighbours), its first `budget` ids. Deterministic,
    so a demonstration stays the expert's moves, and SFT on it teaches a summary that holds
    the state."""
    last = next((t.observation_text for t in reversed(st.turns) if t.observation_text), "")
    ids = st.ep.codec.encode(last.strip())
    return ids[:budget]


def rewrite_stream(st: CompactionState, message: dict) -> tuple[int | None, str]:
    """A template that re-renders history cannot take `message` as a delta: begin a new
    stream whose prompt is the conversation with `message`, rendered once (reason
    "template_rewrite"); (None, its content) as the turn's observation (it lives in the prompt)."""
    ep = st.ep
    ep.new_stream(ep.messages + [message], "template_rewrite")
    if len(ep.ids) + 8 >= st.max_context:
        st.stop, st.terminated = StopReason.CONTEXT_FULL, False
    return None, message["content"]
