"""Parse → gate → execute: one tool call becomes an observation and a receipt, never a crash.

`ToolBox.step(text, gate)` is what a messages-style env does with an action:

1. parse the action (Hermes JSON by default; ``hermes_or_json`` also takes untagged JSON
   calls; or XML tags); no call or a bad one →
   an observation saying what was wrong, ``invalid=True``, no receipt (nothing was called);
2. the host gate decides (`taurl.tools.gate`); denied → an observation with the reason,
   ``invalid=True``, a receipt with ``decision="denied"``;
3. the tool runs with a timeout (the tool's, the box's default, or what is left of the
   wall-time budget); an exception → ``status="error"``, a timeout → ``status="timeout"``,
   both with ``error`` set and the model told; the output is cut to `max_output_chars`.

Only the first call of an action runs; the model is told how many were ignored.

Async tools are cancelled on timeout. Sync tools run in a worker thread, which cannot be
killed: a hung sync tool is abandoned (its thread leaks), so tools that can hang —
anything running code — should be async (the sandbox's are).

Envs are synchronous (`Env.step`), the tools async: `run_blocking` runs a coroutine on one
background event loop shared by the process, so it works whether or not the caller is
itself inside an event loop (the rollout is).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from taurl.data.trajectory import ToolReceipt
from taurl.errors import ConfigError, Error
from taurl.tools.gate import Gate, GateDecision
from taurl.tools.parsers import (
    HERMES_EXAMPLE,
    ParseResult,
    ToolCall,
    parse_hermes,
    parse_hermes_or_json,
    parse_xml,
)
from taurl.tools.specs import ToolSpec

T = TypeVar("T")
RECEIPT_ARG_CHARS = 2000  # argument strings longer than this are cut in the stored receipt


@dataclass(frozen=True)
class CallOutcome:
    """What one action did. `value` is the tool's return value when status is "ok"."""

    observation: str
    receipt: ToolReceipt | None
    invalid: bool = False
    error: str | None = None
    call: ToolCall | None = None
    value: Any = None
    decision: GateDecision | None = None
    parse_kind: str = "ok"

    @property
    def status(self) -> str:
        return self.receipt.status if self.receipt is not None else "invalid"


PARSERS = ("hermes", "hermes_or_json", "xml")


class ToolBox:
    """The tools of an env, their declarations, and the parse → gate → run pipeline."""

    def __init__(self, specs: Sequence[ToolSpec], *, parser: str = "hermes",
                 default_timeout_s: float = 30.0,
                 max_output_chars: int = 8000, example: str = HERMES_EXAMPLE) -> None:
        names = [s.name for s in specs]
        problems = [f"tool {n!r} is declared twice"
                    for n in sorted({n for n in names if names.count(n) > 1})]
        if parser not in PARSERS:
            problems.append(f"parser must be one of {', '.join(PARSERS)}, got {parser!r}")
        if not default_timeout_s > 0 or max_output_chars < 100:
            problems.append("default_timeout_s must be > 0 and max_output_chars >= 100")
        if problems:
            raise ConfigError(problems)
        self.specs = {s.name: s for s in specs}
        self.parser = parser
        self.example = example  # the call that parse errors show
        self.default_timeout_s = default_timeout_s
        self.max_output_chars = max_output_chars

    @property
    def declarations(self) -> list[dict[str, Any]]:
        return [s.openai() for s in self.specs.values()]

    def parse(self, text: str) -> ParseResult:
        if self.parser == "xml":
            return parse_xml(text, {n: s.parameters for n, s in self.specs.items()})
        if self.parser == "hermes_or_json":
            return parse_hermes_or_json(text, example=self.example)
        return parse_hermes(text, example=self.example)

    async def step(self, text: str, gate: Gate) -> CallOutcome:
        """Parse `text` and run its first call (module docstring)."""
        parsed = self.parse(text)
        if not parsed.ok:
            return CallOutcome(f"Error: {parsed.error}", None, invalid=True, parse_kind=parsed.kind)
        out = await self.run(parsed.calls[0], gate)
        if len(parsed.calls) > 1:
            note = (f"\n(Note: only the first tool call runs per turn; {len(parsed.calls) - 1} "
                    "more were ignored.)")
            out = CallOutcome(out.observation + note, out.receipt, out.invalid, out.error, out.call,
                              out.value, out.decision, out.parse_kind)
        return out

    async def run(self, call: ToolCall, gate: Gate) -> CallOutcome:
        """Gate `call`, then run it with its timeout; every failure is in the outcome."""
        args = _receipt_args(call.arguments)
        decision = gate.check(call)
        if not decision.allowed:
            receipt = ToolReceipt(call.name[:200], args, "denied", "denied",
                                  f"{decision.rule}: {decision.reason}")
            return CallOutcome(f"Error: {decision.reason}", receipt, invalid=True, call=call,
                               decision=decision)
        spec = self.specs[call.name]
        timeout = spec.timeout_s or self.default_timeout_s
        if decision.timeout_s is not None:
            timeout = min(timeout, decision.timeout_s)
        t0 = time.perf_counter()
        status, error, value = "ok", None, None
        try:
            if spec.is_async:
                value = await asyncio.wait_for(spec.fn(**call.arguments), timeout)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(spec.fn, **call.arguments),
                                               timeout)
        except asyncio.TimeoutError as e:  # a tool's own timeout (an Error) says what it stopped
            status, error = "timeout", (str(e) if isinstance(e, Error) else
                                        f"tool {call.name!r} timed out after {timeout:g} s and was "
                                        "stopped")
        except Exception as e:  # noqa: BLE001 — a tool's failure is the model's news, not ours
            status, error = ("error", f"tool {call.name!r} failed: {type(e).__name__}: "
                                      f"{_cut(str(e), 500)}")
        latency = time.perf_counter() - t0
        gate.account(latency)
        if status != "ok":
            receipt = ToolReceipt(call.name, args, "allowed", status, error or "", latency)
            return CallOutcome(
                f"Error: {error}", receipt, error=error, call=call, decision=decision
            )
        text = render_value(value)
        shown = _cut(text, self.max_output_chars)
        receipt = ToolReceipt(
            call.name, args, "allowed", "ok", "", latency, len(text), len(shown) < len(text)
        )
        return CallOutcome(shown, receipt, call=call, value=value, decision=decision)


def render_value(value: Any) -> str:
    """A tool's return value as observation text: str as is, None as "ok", else JSON."""
    if value is None:
        return "ok"
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _cut(text: str, limit: int) -> str:
    """`text` with its middle cut so it fits `limit` characters (head and tail kept)."""
    if len(text) <= limit:
        return text
    note = f"\n[... {len(text) - limit} characters cut ...]\n"
    head = max(0, (limit - len(note)) * 2 // 3)
    tail = max(0, limit - len(note) - head)
    return text[:head] + note + (text[-tail:] if tail else "")


def _receipt_args(args: Any) -> dict[str, Any]:
    """The arguments as stored in the receipt: long strings cut, so a huge call stays small."""
    if not isinstance(args, dict):
        return {}
    out: dict[str, Any] = {}
    for k, v in list(args.items())[:32]:
        key = str(k)[:100]
        if isinstance(v, str) and len(v) > RECEIPT_ARG_CHARS:
            out[key] = v[:RECEIPT_ARG_CHARS] + f"...[{len(v) - RECEIPT_ARG_CHARS} more characters]"
        elif isinstance(v, (str, int, float, bool)) or v is None:
            out[key] = v
        else:
            out[key] = _cut(json.dumps(v, default=str), RECEIPT_ARG_CHARS)
    return out


# ---------------------------------------------------------------------------------------
# One background event loop for synchronous callers (Env.step).

_LOOP: dict[str, Any] = {}
_LOOP_LOCK = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    with _LOOP_LOCK:
        loop = _LOOP.get("loop")
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="taurl-tools", daemon=True)
            thread.start()
            _LOOP.update(loop=loop, thread=thread)
        return loop


def run_blocking(coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
    """Run `coro` to completion on the shared background loop and return its result."""
    loop = _background_loop()
    if threading.current_thread() is _LOOP.get("thread"):
        coro.close()
        raise ConfigError(
            "run_blocking was called from a tool running on the background loop; await instead"
        )
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout_s)
