"""Parsers for the tool-call formats models actually emit. They never raise on model text.

* Hermes (Qwen-family chat templates): ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``
  — `parse_hermes`. ``arguments`` may also be a JSON *string* holding an object (the
  OpenAI wire form); a missing ``arguments`` means ``{}``.
* Hermes or bare JSON (``parser="hermes_or_json"``; Qwen2.5-Coder's habit) —
  `parse_hermes_or_json`: the tagged calls when there is a ``<tool_call>`` tag; otherwise
  each JSON object with a ``"name"`` string and an ``"arguments"`` (or ``"parameters"``)
  key, bare or in a ```` ```json ```` fence, is a call. Qwen2.5-Coder was not trained on the
  tags its own chat template asks for and answers with such objects instead (zero-shot on
  code-v0: every call it wrote was one, none tagged; docs/models.md).
* XML tags (the search env's style): ``<search>query</search>`` for a one-argument tool, or
  ``<write_file><path>a.py</path><content>…</content></write_file>`` — `parse_xml`.

Both return a `ParseResult`: the calls found, or an `error` written for the model (what
was wrong and the exact form to use), with a short `kind` for counting:
``"no_call"`` (plain text), ``"malformed"`` (a tag or JSON that does not parse), ``"too_long"``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES = re.compile(re.escape(HERMES_OPEN) + r"(.*?)" + re.escape(HERMES_CLOSE), re.DOTALL)
HERMES_EXAMPLE = '<tool_call>{"name": "TOOL", "arguments": {"ARG": "VALUE"}}</tool_call>'
DEFAULT_MAX_CALL_CHARS = 200_000  # a call longer than this is refused before json.loads


@dataclass(frozen=True)
class ToolCall:
    """One parsed call. `arguments` is the decoded JSON object (not yet validated)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""


@dataclass(frozen=True)
class ParseResult:
    calls: tuple[ToolCall, ...] = ()
    error: str | None = None  # for the model: what was wrong and how to write it
    kind: str = "ok"  # "ok" | "no_call" | "malformed" | "too_long"

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.calls)


def _fail(kind: str, error: str) -> ParseResult:
    return ParseResult((), error, kind)


def parse_hermes(text: str, *, max_call_chars: int = DEFAULT_MAX_CALL_CHARS,
                 example: str = HERMES_EXAMPLE) -> ParseResult:
    """Every ``<tool_call>`` block in `text`, in order; the first bad block fails the parse.

    `example` is the call the error messages show (an env may show one of its own tools: a
    small model copies a placeholder such as ``"TOOL"`` literally)."""
    bodies = _HERMES.findall(text)
    if not bodies:
        if HERMES_OPEN in text:
            return _fail("malformed", f"the {HERMES_OPEN} tag is not closed; end the call with "
                         f"{HERMES_CLOSE}, e.g. {example}")
        return _fail("no_call", f"no tool call found; call a tool as {example}")
    calls = []
    for i, body in enumerate(bodies):
        where = f"tool call {i + 1}" if len(bodies) > 1 else "the tool call"
        if len(body) > max_call_chars:
            return _fail("too_long", f"{where} is {len(body)} characters long; the limit is "
                                     f"{max_call_chars}")
        call = _hermes_call(body.strip(), where, example)
        if isinstance(call, ParseResult):
            return call
        calls.append(call)
    return ParseResult(tuple(calls))


# JSON that also takes raw control characters (a newline typed inside a string): models
# write code into "content" that way, and the intent is unambiguous
_LENIENT = json.JSONDecoder(strict=False)


def parse_hermes_or_json(text: str, *, max_call_chars: int = DEFAULT_MAX_CALL_CHARS,
                         example: str = HERMES_EXAMPLE) -> ParseResult:
    """`parse_hermes` when `text` has a ``<tool_call>`` tag; otherwise the untagged JSON calls
    in it (module docstring), in order. Text with neither is the tagged parser's no-call."""
    tagged = parse_hermes(text, max_call_chars=max_call_chars, example=example)
    if tagged.kind != "no_call" or len(text) > max_call_chars:
        return tagged
    calls: list[ToolCall] = []
    start = text.find("{")
    while start != -1:
        try:
            obj, end = _LENIENT.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            obj, end = None, start + 1
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and \
                ("arguments" in obj or "parameters" in obj):
            call = _call_from(obj, text[start:end], "the tool call", example)
            if isinstance(call, ParseResult):
                return call
            calls.append(call)
        else:
            end = start + 1  # not a call: look inside it too
        start = text.find("{", end)
    return ParseResult(tuple(calls)) if calls else tagged


def _hermes_call(body: str, where: str, example: str = HERMES_EXAMPLE) -> ToolCall | ParseResult:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return _fail("malformed", f"{where} is not valid JSON ({e.msg} at line {e.lineno} column "
                                  f"{e.colno}); "
                     f"write {example}")
    except RecursionError:
        return _fail("malformed", f"{where} nests JSON too deeply; write {example}")
    return _call_from(obj, body, where, example)


def _call_from(obj: Any, body: str, where: str, example: str) -> ToolCall | ParseResult:
    """The call a decoded JSON value names, or why it names none."""
    if not isinstance(obj, dict):
        return _fail("malformed", f"{where} must be a JSON object with \"name\" and \"arguments\", "
                     f"got a JSON {type(obj).__name__}; write {example}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return _fail("malformed", f"{where} has no \"name\" string; write {example}")
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # the OpenAI wire form: arguments serialized as a string
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return _fail("malformed", f"{where}: \"arguments\" is a string that is not a JSON "
                                      "object; "
                         f"pass an object: {example}")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return _fail("malformed", f"{where}: \"arguments\" must be a JSON object, got a JSON "
                     f"{_json_name(args)}; write {example}")
    return ToolCall(name.strip(), args, body)


def _json_name(v: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(v), type(v).__name__)


def parse_xml(text: str, tools: Mapping[str, Mapping[str, Any]], *,
              max_call_chars: int = DEFAULT_MAX_CALL_CHARS) -> ParseResult:
    """Calls written as XML tags named after the tools (`tools`: name → parameters schema).

    A tool with one parameter takes the tag's text as that argument unless child tags
    name parameters. Child values are strings, decoded as JSON when the schema wants a
    number, boolean, array or object. Unknown tags are prose, not calls.
    """
    if not tools:
        return _fail("no_call", "no tools are declared")
    names = "|".join(re.escape(n) for n in sorted(tools, key=len, reverse=True))
    pattern = re.compile(rf"<({names})>(.*?)</\1>", re.DOTALL)
    matches = list(pattern.finditer(text))
    if not matches:
        opened = re.search(rf"<({names})>", text)
        example = f"<{next(iter(tools))}>…</{next(iter(tools))}>"
        if opened:
            return _fail("malformed", f"the <{opened.group(1)}> tag is not closed; write {example}")
        return _fail("no_call", f"no tool call found; use one of the tags {sorted(tools)}, e.g. "
                                f"{example}")
    calls = []
    for m in matches:
        name, body = m.group(1), m.group(2)
        if len(body) > max_call_chars:
            return _fail("too_long", f"the <{name}> call is {len(body)} characters long; the limit "
                                     f"is {max_call_chars}")
        props = dict(tools[name].get("properties", {}))
        children = {k: v for k, v in re.findall(r"<(\w+)>(.*?)</\1>", body,
                                                re.DOTALL) if k in props}
        if not children and len(props) == 1:
            children = {next(iter(props)): body}
        args: dict[str, Any] = {}
        for k, raw in children.items():
            value = raw.strip()
            want = props[k].get("type")
            wants = [want] if isinstance(want, str) else list(want or [])
            if wants and "string" not in wants:
                # undecodable: left a string, and schema validation says what is wrong
                with contextlib.suppress(json.JSONDecodeError, RecursionError):
                    value = json.loads(value)
            args[k] = value
        calls.append(ToolCall(name, args, m.group(0)))
    return ParseResult(tuple(calls))


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A Hermes tool call, exactly as the chat template renders one (transformers' `tojson`
    keeps non-ASCII as is: "São Paulo", never "S\\u00e3o Paulo")."""
    return (
        f'<tool_call>\n{{"name": "{name}", "arguments": '
        f"{json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>"
    )
