"""The OpenAI Responses API on the proxy: ``POST /rollouts/{id}/v1/responses``.

What the OpenAI Agents SDK speaks at its defaults (and NeMo Gym's model side). A request
is translated into the Chat Completions call it stands for and captured by the same
machinery (`ProxyServer.call`: budgets, 429 admission, chains), so the token-exact rules
are the chat route's; only the wire format differs.

Request → chat messages:

* ``instructions`` → the system message (not carried over by ``previous_response_id``,
  as the API says); ``input`` a string → one user message;
* ``message`` items (``input_text`` / ``output_text`` parts) → messages (``developer`` is
  ``system``); ``function_call`` items → the assistant's ``tool_calls``;
  ``function_call_output`` → ``tool`` messages;
* ``reasoning`` items → the ``<think>…</think>`` text they were cut from (below), so an
  agent that sends back what it got extends its chain; one without ``content`` (a summary,
  encrypted content from another model) is accepted and renders nothing;
* ``previous_response_id`` → that response's whole conversation (input and output) first;
  it names a response of the same episode;
* ``tools``: function tools (``{"type": "function", "name", "parameters"}``); hosted tools
  (web search, file search, computer use) are refused: the proxy runs no such tool.

Reply: the sampled text's leading ``<think>…</think>`` (a reasoning model's) becomes a
``reasoning`` item with that text (``reasoning_text``), the rest an ``output_text``
message, each parsed tool call a ``function_call`` item (``call_id`` = the chat tool
call's id). A completion cut at the agent's own ``max_output_tokens`` is ``status:
incomplete``, as the API says; one cut by the proxy's per-action budget
(``max_action_tokens``) is ``completed``: the action budget cuts an action and the episode
goes on, as in the built-in loop, where an ``incomplete`` would end it (the Agents SDK
raises on one). The record keeps the cut either way (``Turn.finish_reason`` ``length``).
Streaming sends the documented event sequence (``response.created`` … ``response.completed``)
built from the same reply, so streaming never changes what is captured.
"""

from __future__ import annotations

import re
import time
from typing import Any

from taurl.proxy.capture import Call, ProxyError
from taurl.proxy.wire import MODEL_NAME

THINK = re.compile(r"\A<think>(.*?)</think>", re.DOTALL)
PATH = "/v1/responses"


def to_chat(body: dict, ep: Any) -> tuple[dict, list[dict]]:
    """(the chat body, the conversation without instructions) of a Responses request."""
    prior: list[dict] = []
    if prev := body.get("previous_response_id"):
        if prev not in ep.responses:
            raise ProxyError(f"previous_response_id {prev!r} names no response of episode "
                             f"{ep.episode_id!r} (known: {sorted(ep.responses)[-3:]})", 400,
                             "previous_response_not_found")
        prior = list(ep.responses[prev])
    raw = body.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    if not isinstance(items, list) or (not items and not prior):
        raise ProxyError("'input' must be a string or a non-empty list of input items")
    conversation = prior + input_messages(items)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ProxyError("'instructions' must be a string")
    messages = ([{"role": "system", "content": instructions}] if instructions
                else []) + conversation
    chat = {"messages": messages, "tools": chat_tools(body.get("tools")) or None,
            "max_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0)}
    return {k: v for k, v in chat.items() if v is not None}, conversation


def chat_tools(tools: Any) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ProxyError("'tools' must be a list")
    out = []
    for t in tools:
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function" or not isinstance(t.get("name"), str):
            raise ProxyError(f"tool type {kind!r} is not served: the proxy serves function tools "
                             "({'type': 'function', 'name', 'parameters'}) only", 400,
                             "unsupported_tool")
        fn = {"name": t["name"],
              **({"description": t["description"]} if t.get("description") else {}),
              "parameters": t.get("parameters") or {"type": "object", "properties": {}}}
        # the chat form, keys in its order (rendered)
        out.append({"type": "function", "function": fn})
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ProxyError("a message's 'content' must be a string or a list of text parts")
    out = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind not in ("input_text", "output_text", "text", "refusal", "reasoning_text",
                        "summary_text"):
            raise ProxyError(f"content part {kind!r} is not served: the proxy's policy reads text "
                             "only")
        out.append(p.get("text") or p.get("refusal") or "")
    return "".join(out)


def input_messages(items: list[Any]) -> list[dict]:
    """Responses input items as chat messages (module docstring)."""
    out: list[dict] = []
    think: list[str] = []  # reasoning text waiting for the assistant turn it belongs to

    def assistant() -> dict:
        if not out or out[-1]["role"] != "assistant" or out[-1].get("_closed"):
            out.append({"role": "assistant", "content": "", "tool_calls": []})
        msg = out[-1]
        if think:
            msg["content"] = "".join(f"<think>{t}</think>" for t in think) + msg["content"]
            think.clear()
        return msg

    for item in items:
        if not isinstance(item, dict):
            raise ProxyError("every input item is a JSON object")
        kind = item.get("type", "message")
        if kind == "reasoning":
            if item.get("content") is not None:
                # ours carry their text; another model's (summary, encrypted) no text to render
                think.append(_text(item["content"]))
        elif kind == "message" and item.get("role") == "assistant":
            msg = assistant()
            if msg["tool_calls"]:  # text after a tool call: a new turn of its own
                msg["_closed"] = True
                msg = assistant()
            msg["content"] += _text(item.get("content", ""))
        elif kind == "function_call":
            assistant()["tool_calls"].append({"id": item.get("call_id", ""), "type": "function",
                                              "function": {
                "name": item.get("name", ""), "arguments": item.get("arguments", "{}")}})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id", ""),
                        "content": _text(item.get("output", ""))})
        elif kind == "message":
            role = {"developer": "system"}.get(item.get("role"), item.get("role"))
            if role not in ("user", "system"):
                raise ProxyError(f"input message role {item.get('role')!r} is not one of user, "
                                 "system, developer, assistant")
            out.append({"role": role, "content": _text(item.get("content", ""))})
        else:
            raise ProxyError(f"input item type {kind!r} is not served: the proxy takes message, "
                             "function_call, function_call_output and reasoning items", 400,
                             "unsupported_input_item")
    if think:
        raise ProxyError("a reasoning item must be followed by the assistant output it preceded")
    for m in out:
        m.pop("_closed", None)
        if m["role"] == "assistant" and not m["tool_calls"]:
            del m["tool_calls"]
    return out


def reply(call: Call, ep: Any, rid: str, conversation: list[dict], asked: Any = None) -> dict:
    """The Response object of `call`; its conversation is kept for ``previous_response_id``."""
    assistant: dict[str, Any] = {"role": "assistant", "content": call.content}
    if call.tool_calls:
        assistant["tool_calls"] = call.tool_calls
    ep.responses[rid] = [*conversation, assistant]
    content = call.content or ""
    output: list[dict] = []
    if m := THINK.match(content):
        output.append({"type": "reasoning", "id": f"rs_{rid}", "summary": [], "status": "completed",
                       "content": [{"type": "reasoning_text", "text": m.group(1)}]})
        content = content[m.end():]
    if content or not call.tool_calls:
        output.append({"type": "message", "id": f"msg_{rid}", "role": "assistant",
                       "status": "completed",
                       "content": [{"type": "output_text", "text": content, "annotations": []}]})
    output += [{"type": "function_call", "id": f"fc_{tc['id']}", "call_id": tc["id"],
                "status": "completed",
                "name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
               for tc in call.tool_calls]
    # the agent's limit
    cut = call.finish_reason == "length" and isinstance(asked, int) and call.sampled >= asked
    return {"id": rid, "object": "response", "created_at": int(time.time()), "model": MODEL_NAME,
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": call.prompt_tokens, "output_tokens": call.sampled,
                      "total_tokens": call.prompt_tokens + call.sampled,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def events(response: dict) -> list[tuple[str, dict]]:
    """The streamed form of `response`: the Responses API's event sequence."""
    out: list[tuple[str, dict]] = []

    def emit(kind: str, **payload: Any) -> None:
        out.append((kind, {"type": kind, "sequence_number": len(out), **payload}))

    start = {**response, "status": "in_progress", "output": [], "incomplete_details": None}
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for i, item in enumerate(response["output"]):
        at = {"output_index": i, "item_id": item["id"]}
        if item["type"] == "message":
            emit("response.output_item.added", output_index=i,
                 item={**item, "status": "in_progress", "content": []})
            part, text = item["content"][0], item["content"][0]["text"]
            emit("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            for j in range(0, len(text), 16):
                emit("response.output_text.delta", **at, content_index=0, delta=text[j:j + 16],
                     logprobs=[])
            emit("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
            emit("response.content_part.done", **at, content_index=0, part=part)
        elif item["type"] == "function_call":
            emit("response.output_item.added", output_index=i,
                 item={**item, "status": "in_progress", "arguments": ""})
            emit("response.function_call_arguments.delta", **at, delta=item["arguments"])
            emit("response.function_call_arguments.done", **at, name=item["name"],
                 arguments=item["arguments"])
        else:
            emit("response.output_item.added", output_index=i, item=item)
        emit("response.output_item.done", output_index=i, item=item)
    emit("response.incomplete" if response["status"] == "incomplete" else "response.completed",
         response=response)
    return out


def error_body(e: ProxyError) -> dict:
    return {"error": {"message": str(e), "type": e.code, "code": e.code, "param": None}}
