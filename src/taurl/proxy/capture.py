"""Token-exact capture of one episode's model calls on the wire (docs/design.md#token-exact).

An agent sends whole chat histories; the engine wants token ids. The capture keeps, per
episode, *chains*: token streams built exactly as the built-in loop builds them.

* The first call of a chain renders its messages once with the chat template → a
  ``prompt`` segment (mask 0).
* The engine's sampled ids are appended as they came, with logprobs and policy version
  (an ``action`` segment, mask 1). The chain's text view keeps the sampled text itself
  as the assistant message, so rendering the chain reproduces the stream.
* A later call *extends* a chain when its messages are the chain's messages as the agent
  saw them (our replies exactly as we returned them), followed by new non-assistant
  messages (tool results, user turns) and the same tools. Those new messages enter as a
  template delta, render[chain + new] minus render[chain] (an ``observation``, mask 0).
* Any other call — a message edited, dropped or reordered, a thinking block stripped, an
  assistant message the policy never sampled, other tools, a branch from an older point —
  starts a new chain whose prompt renders the history as sent (mask 0 throughout). A
  sampled action is thus never re-tokenized into a training target; the reason is kept
  (`Chain.reason`), as LightningRL keeps each call's own transition.

`/v1/completions` chains work on raw text: a prompt that starts with the chain's text
extends it (the rest is encoded once as an observation); any other starts a new chain.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from taurl.data.trajectory import Segment
from taurl.errors import Error
from taurl.rollout.loop import ChatCodec
from taurl.tools.parsers import parse_hermes


class ProxyError(Error):
    """A request the proxy cannot serve; `status` is the HTTP status it answers with."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request_error",
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.headers = status, code, dict(headers or {})


@dataclass
class Call:
    """One model call: what the engine got and gave, and what the agent got back."""

    chain: int
    action_segment: int
    # the delta that preceded this call's action (None: chain start)
    observation_segment: int | None
    text: str  # the sampled text, decoded from the sampled ids
    content: str | None  # the OpenAI message content returned
    tool_calls: list[dict[str, Any]]  # OpenAI tool_calls returned ([] for none)
    finish_reason: str  # the engine's
    parse: str  # "ok" | "no_call" | "malformed" | "too_long" | "no_tools"
    generate_s: float = 0.0
    index: int = 0  # the call's place among all calls of the episode
    prompt_tokens: int = 0
    sampled: int = 0
    stop_sequence: str | None = None  # the agent's stop sequence that ended it (`matched_stop`)


@dataclass
class Chain:
    """A token stream: segments, their text, the template view and the agent's view."""

    codec: ChatCodec
    # why this chain started: "first_call" or why the previous chain could not be extended
    reason: str
    kind: str = "chat"  # "chat" | "completion"
    segments: list[Segment] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    text: str = ""
    render_msgs: list[dict[str, Any]] = field(default_factory=list)  # what the template renders
    # normalized messages as the agent saw them
    wire: list[dict[str, Any]] = field(default_factory=list)
    tools_key: str = ""
    open: bool = False  # the last message is our reply, not yet extended
    calls: list[Call] = field(default_factory=list)
    # the state before the last extension (messages, wire, text length), so a call the proxy
    # then refuses (`EpisodeCapture.retract`) leaves no observation without its action
    _before_extension: tuple[int, list[dict[str, Any]], int] | None = None

    def append(self, kind: str, ids: list[int], logprobs: list[float] | None = None,
               version: int | None = None) -> int:
        self.segments.append(Segment(kind, tuple(ids),
                                     None if logprobs is None else tuple(logprobs), version))
        self.ids.extend(ids)
        self.text += self.codec.decode(ids)
        return len(self.segments) - 1


def normalize(msg: Any) -> dict[str, Any]:
    """An OpenAI message as a plain comparable dict: role, content text, tool calls (name,
    parsed arguments, id), tool_call_id. Raises ProxyError for a message without a role."""
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        raise ProxyError("every message is a JSON object with a string 'role'")
    content = msg.get("content")
    if isinstance(content, list):  # content parts: the text ones, in order
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                          and p.get("type") == "text")
    out: dict[str, Any] = {"role": msg["role"], "content": content or ""}
    calls = []
    for c in msg.get("tool_calls") or []:
        fn = (c or {}).get("function") or {}
        args = fn.get("arguments", "{}")
        with contextlib.suppress(json.JSONDecodeError):  # else compared as the string it is
            args = json.loads(args) if isinstance(args, str) else args
        calls.append({"id": c.get("id", ""), "name": fn.get("name", ""), "arguments": args})
    if calls:
        out["tool_calls"] = calls
    if msg.get("tool_call_id"):
        out["tool_call_id"] = msg["tool_call_id"]
    return out


def template_message(m: dict[str, Any]) -> dict[str, Any]:
    """A normalized message as the chat template reads it."""
    out = {"role": m["role"], "content": m["content"]}
    if m.get("tool_calls"):
        out["tool_calls"] = [{"type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for c in m["tool_calls"]]
    return out


def matched_stop(stop: Any, matched: str | int | None, codec: ChatCodec) -> str | None:
    """The agent's stop sequence (``stop``, as the call gave it) that ended a call. The engine
    reports a stop string as itself and a one-token stop as its id (`ChatCodec.split_stops`
    turned that stop into the id); None when no stop of the agent's ended it (EOS, length)."""
    if matched is None:
        return None
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    text = matched if isinstance(matched, str) else codec.decode([matched])
    return text if text in stops else None


class EpisodeCapture:
    """Every chain of one episode (module docstring). Not thread-safe: one event loop uses it."""

    def __init__(self, tokenizer: Any, episode_id: str):
        self.tok = tokenizer
        self.episode_id = episode_id
        self.chains: list[Chain] = []
        # sampled tool calls that did not parse (returned as plain content)
        self.malformed_calls = 0
        self.eos_text = (tokenizer.decode([tokenizer.eos_token_id])
                         if tokenizer.eos_token_id is not None else None)

    # -- chat -----------------------------------------------------------------------
    def chat_prompt(self, messages: list[Any], tools: list[dict] | None) -> tuple[int, int | None]:
        """The chain (index) this call continues or starts, and its observation segment."""
        if not isinstance(messages, list) or not messages:
            raise ProxyError("'messages' must be a non-empty list of messages")
        wire = [normalize(m) for m in messages]
        key = json.dumps(tools or [], sort_keys=True)
        reason = "first_call" if not self.chains else None
        for i in range(len(self.chains) - 1, -1, -1):
            c = self.chains[i]
            why = _extension_problem(c, wire, key)
            if why is None:
                new = wire[len(c.wire):]
                c._before_extension = (len(c.render_msgs), c.wire, len(c.text))
                c.render_msgs += [template_message(m) for m in new]
                delta = c.codec.delta(c.text, c.render_msgs, add_generation_prompt=True)
                obs = c.append("observation", c.codec.encode(delta))
                c.wire = wire
                c.open = False
                return i, obs
            if i == len(self.chains) - 1:
                reason = why  # the newest chain's reason is the one recorded
        codec = ChatCodec(self.tok, tools)
        c = Chain(codec, reason or "first_call", tools_key=key, wire=wire,
                  render_msgs=[template_message(m) for m in wire])
        c.append("prompt", codec.encode(codec.render(c.render_msgs, add_generation_prompt=True)))
        self.chains.append(c)
        return len(self.chains) - 1, None

    def chat_result(self, chain: int, obs: int | None, ids: list[int], logprobs: list[float],
                    version: int,
                    finish_reason: str, has_tools: bool, generate_s: float = 0.0) -> Call:
        """Append the sampled ids to `chain`; parse them into the OpenAI reply."""
        c = self.chains[chain]
        a = c.append("action", ids, logprobs, version)
        text = c.codec.decode(ids)
        body = (text[:-len(self.eos_text)] if finish_reason == "eos" and self.eos_text
                and text.endswith(self.eos_text) else text)
        content, tool_calls, parse = body, [], "no_tools"
        if has_tools:
            res = parse_hermes(body)
            parse = res.kind
            if res.ok:
                n = sum(len(x.tool_calls) for x in c.calls)
                tool_calls = [{"id": f"call_{self.episode_id}_{chain}_{n + j}", "type": "function",
                               "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)}}
                              for j, tc in enumerate(res.calls)]
                content = _strip_calls(body).strip()
            elif res.kind in ("malformed", "too_long"):
                self.malformed_calls += 1
        reply = {"role": "assistant", "content": content or None}
        if tool_calls:
            reply["tool_calls"] = tool_calls
        c.wire.append(normalize(reply))
        c.render_msgs.append({"role": "assistant", "content": body})  # the sampled text itself
        c.open = True
        call = Call(chain, a, obs, text, content or None, tool_calls,
                    finish_reason, parse, generate_s)
        c.calls.append(call)
        return call

    def retract(self, chain: int, obs: int | None) -> None:
        """Undo `chat_prompt`'s or `completion_prompt`'s (chain, obs) for a call that was refused
        before sampling: the chain it started is dropped, the observation it appended removed, so
        the record ends where the last sampled action did (as the built-in loop's does at a full
        context)."""
        c = self.chains[chain]
        if obs is None:
            if chain == len(self.chains) - 1 and not c.calls:
                self.chains.pop()
            return
        seg = c.segments.pop()
        del c.ids[len(c.ids) - len(seg.token_ids):]
        n_msgs, c.wire, n_text = c._before_extension
        del c.render_msgs[n_msgs:]
        c.text = c.text[:n_text]
        c.open, c._before_extension = True, None

    # -- completions ----------------------------------------------------------------
    def completion_prompt(self, prompt: str) -> tuple[int, int | None]:
        if not isinstance(prompt, str) or not prompt:
            raise ProxyError("'prompt' must be a non-empty string")
        for i in range(len(self.chains) - 1, -1, -1):
            c = self.chains[i]
            if (c.kind == "completion" and c.open and prompt.startswith(c.text)
                and len(prompt) > len(c.text)):
                c._before_extension = (len(c.render_msgs), c.wire, len(c.text))
                obs = c.append("observation", c.codec.encode(prompt[len(c.text):]))
                c.open = False
                return i, obs
        reason = "first_call" if not self.chains else "prompt_not_an_extension"
        c = Chain(ChatCodec(self.tok), reason, kind="completion")
        c.append("prompt", c.codec.encode(prompt))
        self.chains.append(c)
        return len(self.chains) - 1, None

    def completion_result(self, chain: int, obs: int | None, ids: list[int], logprobs: list[float],
                          version: int, finish_reason: str, generate_s: float = 0.0) -> Call:
        c = self.chains[chain]
        a = c.append("action", ids, logprobs, version)
        text = c.codec.decode(ids)
        c.open = True
        call = Call(chain, a, obs, text, text, [], finish_reason, "no_tools", generate_s)
        c.calls.append(call)
        return call

    def close_chain(self, c: Chain) -> None:
        """The end-of-turn tokens the template adds after the last reply (mask 0)."""
        if c.kind != "chat" or not c.open:
            return
        closing = c.codec.delta(c.text, c.render_msgs, add_generation_prompt=False)
        if closing:
            c.append("template", c.codec.encode(closing))
        c.open = False


def _extension_problem(c: Chain, wire: list[dict], key: str) -> str | None:
    """None when `wire` extends chain `c` append-only; else why not, in snake_case."""
    if c.kind != "chat":
        return "endpoint_changed"
    if key != c.tools_key:
        return "tools_changed"
    if not c.open:
        return "branch"  # the chain already went on from here: this call forks it
    n = len(c.wire)
    for a, b in zip(wire, c.wire, strict=False):
        if a != b:
            return "assistant_edited" if b["role"] == "assistant" else "history_edited"
    if len(wire) <= n:
        return "history_shortened"
    if any(m["role"] == "assistant" for m in wire[n:]):
        return "unsampled_assistant"
    return None


def _strip_calls(text: str) -> str:
    import re

    return re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.DOTALL)
