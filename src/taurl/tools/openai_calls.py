"""Gate and run one OpenAI-format tool call (what an agent behind the proxy sends).

    box, gate = ToolBox(specs), Gate(specs, GateConfig(allow=...))
    result = await call_gated(tool_call, box, gate)   # tool_call: an OpenAI `tool_calls` item
    messages.append(result.message)                   # {"role": "tool", "tool_call_id", "content"}
    result.outcome.receipt                            # the gate's decision and the execution

The same pipeline as the built-in loop's `ToolBox.step`, minus the text parsing: the
call's ``function.arguments`` (a JSON string, or already an object) is decoded, then the
host gate decides and the tool runs (`ToolBox.run`). Undecodable arguments never reach the
gate or the tool: an error message back to the agent, ``invalid`` and no receipt (nothing
was called), as a malformed call in the built-in loop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taurl.tools.executor import CallOutcome, ToolBox
from taurl.tools.gate import Gate
from taurl.tools.parsers import ToolCall


@dataclass(frozen=True)
class GatedCall:
    """message: the ``tool`` message to send back to the agent; outcome: what happened."""

    message: dict[str, Any]
    outcome: CallOutcome


def parse_openai_call(tool_call: Mapping[str, Any]) -> ToolCall | str:
    """The `ToolCall` of an OpenAI ``tool_calls`` item, or what is wrong with it (for the agent)."""
    fn = tool_call.get("function") if isinstance(tool_call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"].strip():
        return ('the tool call has no function name; send {"type": "function", "function": '
                '{"name", "arguments"}}')
    args: Any = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError) as e:
            return (f"the arguments of {fn['name'][:80]!r} are not valid JSON "
                    f"({getattr(e, 'msg', 'too deep')}); send a JSON object")
    if not isinstance(args, dict):
        return (f"the arguments of {fn['name'][:80]!r} must be a JSON object, got "
                f"{type(args).__name__}")
    return ToolCall(fn["name"].strip(), args,
                    json.dumps({"name": fn["name"], "arguments": args}, default=str))


async def call_gated(tool_call: Mapping[str, Any], toolbox: ToolBox, gate: Gate) -> GatedCall:
    """Gate and run `tool_call` (module docstring); never raises on the agent's input."""
    call_id = str(tool_call.get("id", "")) if isinstance(tool_call, Mapping) else ""
    parsed = parse_openai_call(tool_call)
    if isinstance(parsed, str):
        outcome = CallOutcome(f"Error: {parsed}", None, invalid=True, parse_kind="malformed")
    else:
        outcome = await toolbox.run(parsed, gate)
    return GatedCall({"role": "tool", "tool_call_id": call_id, "content": outcome.observation},
                     outcome)
