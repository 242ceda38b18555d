"""The token stream of one episode: the chat codec and the growing ids, segments and messages.

`ChatCodec` renders chat messages with the tokenizer's template and encodes text once;
`_Episode` appends segments (prompt, action, observation, template) to the ids and keeps
the text view (`messages`) built from the decoded segments, so ``decode(ids) ==
chat_template(messages)`` holds by construction. History is never re-encoded.

An episode may be a chain of streams (`taurl.rollout.compaction`): `new_stream` closes the
current one and begins another with a prompt rendered once; `ids`, `text` and `messages` are
then the new stream's, `all_messages` and `starts` the chain's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from taurl.data.streams import StreamStart
from taurl.data.trajectory import Segment
from taurl.errors import ContractError


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
        return self.tok.decode(list(ids), skip_special_tokens=False,
                               clean_up_tokenization_spaces=False)

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
            raise ContractError("template_prefix", "the chat template does not render the "
                                                   "conversation so far as a "
                                "prefix of the next one; observations cannot be appended as a "
                                "template delta")
        return target[len(stream_text):]


class _Episode:
    """The growing token stream of one episode and its text view."""

    def __init__(self, codec: ChatCodec, messages: list[dict]):
        self.codec = codec
        self.messages = messages
        self.segments: list[Segment] = []
        self.ids: list[int] = []  # the current stream's
        self.text = ""
        self.header = [dict(m) for m in messages]  # the episode's first messages (system, task)
        self.done_messages: list[dict] = []  # the messages of the streams before this one
        self.starts: list[StreamStart] = []
        self.first_segment = 0  # the current stream's prompt segment

    @property
    def all_messages(self) -> list[dict]:
        return self.done_messages + self.messages

    def close_stream(self, strict: bool = True) -> None:
        """Close the stream with the template's end-of-turn ids (kind "template", mask 0).
        Not `strict`: a template that cannot render the close as a delta leaves it open."""
        if self.messages[-1]["role"] != "assistant":
            # the stream ends inside an opened assistant turn: close it empty
            self.add_to_assistant("")
        try:
            closing = self.codec.delta(self.text, self.messages, add_generation_prompt=False)
        except ContractError:
            if strict:
                raise
            closing = ""
        if closing:
            self.append("template", self.codec.encode(closing))

    def new_stream(self, messages: list[dict], reason: str, prefix: str = "") -> None:
        """Close this stream and begin another: `messages` rendered once (with the generation
        prompt) + `prefix` (inline: the start of the assistant message) as its prompt. The
        prompt is rendered first: a template that raises leaves this stream as it was."""
        messages = [dict(m) for m in messages]
        prompt = self.codec.encode(self.codec.render(messages, add_generation_prompt=True) + prefix)
        self.close_stream(strict=False)
        self.done_messages += self.messages
        self.starts.append(StreamStart(len(self.segments), len(self.done_messages), reason))
        self.first_segment = len(self.segments)
        self.messages, self.ids, self.text = messages, [], ""
        self.append("prompt", prompt)
        if prefix:
            self.add_to_assistant(prefix)

    @property
    def turns_in_stream(self) -> bool:
        """Whether the current stream holds anything past its prompt (there is something to
        compact)."""
        return len(self.segments) > self.first_segment + 1

    def exchanges(self) -> list[tuple[dict, dict]]:
        """(assistant, answer) message pairs of the current stream (a messages env's turns)."""
        ms = self.messages
        return [(ms[i], ms[i + 1]) for i in range(len(self.header) - 1, len(ms) - 1)
                if ms[i]["role"] == "assistant"
                and ms[i + 1]["role"] not in ("assistant", "system")]

    def append(self, kind: str, ids: list[int], logprobs=None, version=None) -> tuple[int, str]:
        text = self.codec.decode(ids)
        self.segments.append(Segment(kind, tuple(ids),
                                     None if logprobs is None else tuple(logprobs), version))
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
        self.segments[-1] = Segment(
            "action", last.token_ids + tuple(ids), last.logprobs + tuple(logprobs), version
        )
        self.ids.extend(ids)
        self.text += text
        return len(self.segments) - 1, text

    def add_to_assistant(self, text: str) -> None:
        if self.messages[-1]["role"] != "assistant":
            self.messages.append({"role": "assistant", "content": ""})
        self.messages[-1]["content"] += text


def _cut(ids: list[int], max_tokens: int, keep_tail: int) -> tuple[list[int], int]:
    """Cut `ids` to `max_tokens` in tokens (not characters), keeping the last `keep_tail`."""
    if len(ids) <= max_tokens:
        return ids, 0
    tail = min(keep_tail, max_tokens)
    return ids[: max_tokens - tail] + ids[len(ids) - tail :], len(ids) - max_tokens
