"""The OpenAI wire format of one captured call: chat and completion bodies, streamed chunks."""

from __future__ import annotations

import time
from typing import Any

from taurl.proxy.capture import Call

MODEL_NAME = "taurl-policy"


def _finish(call: Call) -> str:
    return ("tool_calls" if call.tool_calls else "length" if call.finish_reason == "length"
            else "stop")


def _chat_body(rid: str, call: Call, prompt_tokens: int) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": call.content}
    if call.tool_calls:
        msg["tool_calls"] = call.tool_calls
    return {"id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [{"index": 0, "message": msg, "finish_reason": _finish(call),
                         "logprobs": None}],
            "usage": _usage(call, prompt_tokens)}


def _usage(call: Call, prompt_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": call.sampled,
            "total_tokens": prompt_tokens + call.sampled}


def _chat_chunks(rid: str, call: Call) -> list[dict]:
    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": MODEL_NAME,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    text = call.content or ""
    out += [chunk({"content": text[i:i + 16]}) for i in range(0, len(text), 16)]
    for j, tc in enumerate(call.tool_calls):
        out.append(chunk({"tool_calls": [{"index": j, "id": tc["id"], "type": "function",
                                          "function": {"name": tc["function"]["name"],
                                                       "arguments": ""}}]}))
        out.append(chunk({"tool_calls": [{
            "index": j, "function": {"arguments": tc["function"]["arguments"]}}]}))
    out.append(chunk({}, _finish(call)))
    return out


def _completion_body(rid: str, call: Call) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [{"index": 0, "text": call.text, "finish_reason": _finish(call),
                         "logprobs": None}]}
