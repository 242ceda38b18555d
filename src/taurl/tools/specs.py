"""Tool specs: a typed Python function (sync or async) becomes an OpenAI function declaration.

    @tool(scopes=("write",))
    def write_file(path: str, content: str) -> str:
        '''Write a file in the workspace.

        Args:
            path: Where, relative to the workspace, e.g. "solution.py".
            content: The whole new text of the file.
        '''

    write_file.openai()  # {"type": "function", "function": {"name", "description", "parameters"}}

The schema comes from the signature (types → JSON Schema types; a parameter without a
default is required; ``X | None = None`` is optional) and the docstring (its first
paragraph is the description; a Google-style ``Args:`` section describes the arguments).
Supported annotations: str, int, float, bool, list[X], dict[str, X], Literal[...],
``X | None``. Anything else raises `ConfigError` at declaration time, not at call time.

`validate_arguments` checks a call's arguments against the subset of JSON Schema these
declarations use (type, enum, items, required, additionalProperties, maxLength) and
returns every problem found, in words the model can act on.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from taurl.errors import ConfigError

SCOPES = ("read", "write", "execute", "network", "destructive")
Scope = Literal["read", "write", "execute", "network", "destructive"]

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class ToolSpec:
    """A callable tool and its declaration.

    scopes: the permissions a call needs (`SCOPES`); the host gate grants or refuses them.
    cost: what one call costs against a cost budget (any unit the gate's budget uses).
    timeout_s: the executor cancels a call that runs longer (None: the executor default).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] = field(repr=False, compare=False)
    is_async: bool = False
    scopes: frozenset[str] = frozenset({"read"})
    cost: float = 0.0
    timeout_s: float | None = None

    def openai(self) -> dict[str, Any]:
        """The OpenAI function-calling declaration (what chat templates' `tools=` take)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": self.parameters}}


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         scopes: tuple[str, ...] | frozenset[str] = ("read",), cost: float = 0.0,
         timeout_s: float | None = None, max_string_chars: int | None = None) -> Any:
    """Decorator (bare or with options) turning `fn` into a `ToolSpec` (see the module doc).

    `max_string_chars` adds ``maxLength`` to every string argument: a huge argument is then
    a schema violation the model is told about, not a memory problem.
    """

    def build(f: Callable[..., Any]) -> ToolSpec:
        return function_spec(f, name=name, scopes=scopes, cost=cost, timeout_s=timeout_s,
                             max_string_chars=max_string_chars)

    return build(fn) if fn is not None else build


def function_spec(fn: Callable[..., Any], *, name: str | None = None,
                  scopes: tuple[str, ...] | frozenset[str] = ("read",), cost: float = 0.0,
                  timeout_s: float | None = None, max_string_chars: int | None = None) -> ToolSpec:
    """The `ToolSpec` of `fn`; raises ConfigError listing every problem with the declaration."""
    tool_name = name or fn.__name__
    problems: list[str] = []
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool_name):
        problems.append(f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'")
    bad_scopes = sorted(set(scopes) - set(SCOPES))
    if bad_scopes:
        problems.append(f"tool {tool_name!r}: unknown scope(s) {bad_scopes}; use {SCOPES}")
    if cost < 0 or (timeout_s is not None and not timeout_s > 0):
        problems.append(f"tool {tool_name!r}: cost must be >= 0 and timeout_s > 0 or None")
    description, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    if not description:
        problems.append(f"tool {tool_name!r} has no docstring; its first paragraph is the "
                        "description the model reads")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # an unresolvable forward reference
        raise ConfigError(f"tool {tool_name!r}: cannot resolve type hints ({e})") from None
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            problems.append(f"tool {tool_name!r}: *{p.name} / **{p.name} cannot be declared; name "
                            "every argument")
            continue
        if p.name not in hints:
            problems.append(f"tool {tool_name!r}: argument {p.name!r} needs a type annotation")
            continue
        try:
            schema, optional = annotation_schema(hints[p.name])
        except ConfigError as e:
            problems.append(f"tool {tool_name!r}: argument {p.name!r}: {e.problems[0]}")
            continue
        if max_string_chars is not None and "string" in _types(schema):
            schema["maxLength"] = max_string_chars
        if p.name in arg_docs:
            schema["description"] = arg_docs[p.name]
        properties[p.name] = schema
        if p.default is inspect.Parameter.empty and not optional:
            required.append(p.name)
    if problems:
        raise ConfigError(problems)
    parameters = {"type": "object", "properties": properties, "required": required,
                  "additionalProperties": False}
    return ToolSpec(tool_name, description, parameters, fn, inspect.iscoroutinefunction(fn),
                    frozenset(scopes), float(cost), timeout_s)


def annotation_schema(hint: Any) -> tuple[dict[str, Any], bool]:
    """(JSON Schema of `hint`, whether None is allowed)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise ConfigError("unions other than `X | None` have no single JSON type; split the "
                              "tool")
        inner = annotation_schema(rest[0])[0]
        inner["type"] = [inner["type"], "null"]  # JSON Schema's nullable form
        return inner, True
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}, False
    if origin is Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in _JSON_TYPES:
            raise ConfigError("Literal values must all be str, or all int, …")
        return {"type": _JSON_TYPES[next(iter(kinds))], "enum": list(args)}, False
    if origin is list or hint is list:
        item = annotation_schema(args[0])[0] if args else {}
        return ({"type": "array", "items": item} if item else {"type": "array"}), False
    if origin is dict or hint is dict:
        if args and args[0] is not str:
            raise ConfigError("dict keys must be str (JSON object keys are strings)")
        return {"type": "object"}, False
    raise ConfigError(f"annotation {hint!r} has no JSON Schema here; use str, int, float, bool, "
                      "list[...], dict[str, ...], Literal[...]")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) from a Google-style docstring."""
    paragraphs = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)
    description = " ".join(paragraphs[0].split()) if paragraphs and paragraphs[0] else ""
    if description.lower().startswith(("args:", "arguments:")):
        description = ""
    args: dict[str, str] = {}
    in_args, current = False, None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            in_args, current = True, None
            continue
        if in_args:
            if stripped.endswith(":") and not line.startswith((" ", "\t")):
                in_args = False  # the next section (Returns:, Raises:)
                continue
            m = _ARG_LINE.match(line)
            if m and not line.startswith(" " * 12):
                current = m.group(1).lstrip("*")
                args[current] = m.group(2).strip()
            elif current and stripped:
                args[current] = f"{args[current]} {stripped}".strip()
    return description, args


# ---------------------------------------------------------------------------------------
# Validation of call arguments against the declared schema.


def _types(schema: dict[str, Any]) -> list[str]:
    typ = schema.get("type")
    return [] if typ is None else [typ] if isinstance(typ, str) else list(typ)


def _type_ok(value: Any, typ: str) -> bool:
    if typ == "string":
        return isinstance(value, str)
    if typ == "boolean":
        return isinstance(value, bool)
    if typ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if typ == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ == "array":
        return isinstance(value, list)
    if typ == "object":
        return isinstance(value, dict)
    if typ == "null":
        return value is None
    return True


def _json_type(value: Any) -> str:
    for typ in ("boolean", "integer", "number", "string", "array", "object", "null"):
        if _type_ok(value, typ):
            return typ
    return type(value).__name__


def validate_value(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    """Problems of `value` against `schema` (type, enum, maxLength, items)."""
    allowed = _types(schema)
    if allowed and not any(_type_ok(value, t) for t in allowed):
        want = " or ".join(allowed)
        return [f"{where} must be {'an' if want[0] in 'aeiou' else 'a'} {want}, got "
                f"{_json_type(value)}"]
    typ = next((t for t in allowed if _type_ok(value, t)), None)
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where} must be one of {schema['enum']}, got {_short(value)}"]
    if "maxLength" in schema and isinstance(value, str) and len(value) > schema["maxLength"]:
        return [f"{where} is {len(value)} characters long; the limit is {schema['maxLength']}"]
    if typ == "array" and "items" in schema:
        out: list[str] = []
        for i, v in enumerate(value):
            out += validate_value(v, schema["items"], f"{where}[{i}]")
            if len(out) >= 3:
                break
        return out
    return []


def validate_arguments(arguments: Any, parameters: dict[str, Any]) -> list[str]:
    """Every problem of `arguments` against an object schema `parameters` (empty if valid)."""
    if not isinstance(arguments, dict):
        return [f'"arguments" must be a JSON object, got {_json_type(arguments)}']
    props = parameters.get("properties", {})
    problems = [f"missing required argument {r!r}" for r in parameters.get("required", [])
                if r not in arguments]
    unknown = sorted(str(k) for k in arguments if k not in props)
    if unknown and parameters.get("additionalProperties") is False:
        problems.append(f"unknown argument(s) {[u[:40] for u in unknown[:5]]}; this tool takes "
                        f"{sorted(props) or 'no arguments'}")
    for k, v in arguments.items():
        if k in props:
            problems += validate_value(v, props[k], f"argument {k!r}")
    return problems


def _short(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."
