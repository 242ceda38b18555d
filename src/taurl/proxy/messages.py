"""Anthropic's Messages API on the proxy: ``POST /rollouts/{id}/v1/messages``.

What an agent on the `anthropic` SDK speaks (its ``base_url`` is the episode's root,
``{proxy}/rollouts/{id}``: the SDK adds ``/v1/messages``). As with the Responses API
(`taurl.proxy.responses`), a request is translated into the chat call it stands for and
captured by the chat route's machinery: same budgets, 429 admission, chains.

Request → chat messages: ``system`` (a string or text blocks) → the system message; a
user turn's ``text`` blocks → a user message, its ``tool_result`` blocks → ``tool``
messages (in their order); an assistant turn's ``text`` blocks → its content,
``tool_use`` blocks → its ``tool_calls``, ``thinking`` blocks → the ``<think>…</think>``
text they were cut from; ``tools`` (``name``, ``description``, ``input_schema``) →
function tools; ``stop_sequences`` → stop strings; ``max_tokens`` (required) is capped by
the proxy's budget as any call's. Images and documents are refused (the policy reads text).

Reply: a ``thinking`` block for the sampled text's leading ``<think>…</think>`` (its
``signature`` empty: nothing is signed), a ``text`` block, a ``tool_use`` block per parsed
tool call; ``stop_reason`` ``tool_use``, ``stop_sequence`` (one of the request's
``stop_sequences`` ended it: ``stop_sequence`` names it, as Anthropic's API does),
``max_tokens`` or ``end_turn``. Streaming sends
``message_start`` … ``message_stop`` from the same reply. Errors use Anthropic's shape
(``{"type": "error", "error": {"type", "message"}}``) with the chat route's statuses and
headers (``retry-after`` on a 429, which the SDK honours).
"""

from __future__ import annotations

import json
from typing import Any

from taurl.proxy.capture import Call, ProxyError
from taurl.proxy.responses import THINK
from taurl.proxy.wire import MODEL_NAME

PATH = "/v1/messages"
_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 409: "invalid_request_error",
                429: "rate_limit_error", 500: "api_error"}


def to_chat(body: dict) -> dict:
    """The chat body a Messages request stands for (module docstring)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ProxyError("'messages' must be a non-empty list of messages")
    system = body.get("system")
    out = [{"role": "system", "content": _text(system)}] if system else []
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ProxyError("every message is an object with role 'user' or 'assistant'")
        content = m.get("content", "")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise ProxyError("a message's 'content' must be a string or a list of content blocks")
        out += _assistant(blocks) if m["role"] == "assistant" else _user(blocks)
    tools = [{"type": "function",
              "function": {"name": t.get("name"), "description": t.get("description", ""),
                                               "parameters": (t.get("input_schema")
                                                              or {"type": "object"})}}
             for t in body.get("tools") or []]
    stop = body.get("stop_sequences")
    chat = {"messages": out, "tools": tools or None, "max_tokens": body.get("max_tokens"),
            "stop": stop,
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0)}
    return {k: v for k, v in chat.items() if v is not None}


def _text(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise ProxyError("text must be a string or a list of text blocks")
    return "".join(_block_text(b) for b in blocks)


def _block_text(b: Any) -> str:
    kind = b.get("type") if isinstance(b, dict) else None
    if kind != "text":
        raise ProxyError(f"content block {kind!r} is not served here: the proxy's policy reads "
                         "text only")
    return b.get("text", "")


def _user(blocks: list) -> list[dict]:
    out: list[dict] = []
    for b in blocks:
        if isinstance(b, dict) and b.get("type") == "tool_result":
            out.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""),
                        "content": _text(b.get("content", ""))})
        elif out and out[-1]["role"] == "user":
            out[-1]["content"] += _block_text(b)
        else:
            out.append({"role": "user", "content": _block_text(b)})
    return out


def _assistant(blocks: list) -> list[dict]:
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    calls = []
    for b in blocks:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "thinking":
            msg["content"] += f"<think>{b.get('thinking', '')}</think>"
        elif kind == "tool_use":
            calls.append({"id": b.get("id", ""), "type": "function",
                          "function": {"name": b.get("name", ""),
                                       "arguments": b.get("input") or {}}})
        else:
            msg["content"] += _block_text(b)
    if calls:
        msg["tool_calls"] = calls
    return [msg]


def reply(call: Call, rid: str) -> dict:
    """The Message object of `call` (module docstring)."""
    content = call.content or ""
    blocks: list[dict] = []
    if m := THINK.match(content):
        blocks.append({"type": "thinking", "thinking": m.group(1), "signature": ""})
        content = content[m.end():]
    if content or not call.tool_calls:
        blocks.append({"type": "text", "text": content})
    blocks += [{"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                "input": json.loads(tc["function"]["arguments"])} for tc in call.tool_calls]
    stop = ("tool_use" if call.tool_calls else "stop_sequence" if call.stop_sequence is not None
            else "max_tokens" if call.finish_reason == "length" else "end_turn")
    matched = call.stop_sequence if stop == "stop_sequence" else None
    return {"id": rid, "type": "message", "role": "assistant", "model": MODEL_NAME,
            "content": blocks, "stop_reason": stop, "stop_sequence": matched,
            "usage": {"input_tokens": call.prompt_tokens, "output_tokens": call.sampled}}


def events(message: dict) -> list[tuple[str, dict]]:
    """The streamed form of `message`: Anthropic's event sequence."""
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**message["usage"], "output_tokens": 0}}
    out = [("message_start", {"type": "message_start", "message": start})]
    for i, b in enumerate(message["content"]):
        if b["type"] == "text":
            first, deltas = {"type": "text",
                             "text": ""}, [{"type": "text_delta", "text": b["text"]}]
        elif b["type"] == "thinking":
            first = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": b["thinking"]},
                      {"type": "signature_delta", "signature": ""}]
        else:
            first, deltas = ({**b, "input": {}},
                             [{"type": "input_json_delta", "partial_json": json.dumps(b["input"])}])
        out.append(("content_block_start",
                    {"type": "content_block_start", "index": i, "content_block": first}))
        out += [("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
                for d in deltas]
        out.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(("message_delta",
                {"type": "message_delta",
                 "usage": {"output_tokens": message["usage"]["output_tokens"]},
                                  "delta": {"stop_reason": message["stop_reason"],
                                            "stop_sequence": message["stop_sequence"]}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


def error_body(e: ProxyError) -> dict:
    return {"type": "error",
            "error": {"type": _ERROR_TYPES.get(e.status, "api_error"), "message": str(e)}}
