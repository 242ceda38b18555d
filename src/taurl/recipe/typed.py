"""Mappings of a config file read as typed option records, and the one "did you mean".

A config option whose keys are fixed by taurl (``rollout.compaction``, ``rl.dpo``,
``promotion``, ...) is written in the file as a mapping and held by the config as an
instance of its option class, a frozen dataclass: the class's fields are its keys, their
types and defaults, and their comments its documentation (docs/reference/config.md). This
module turns such a mapping into its record (`as_record`) and back (`record_mapping`), and
reports an unknown key with the nearest known one (`unknown_option`: the message every
loader of the recipe uses) and a value of the wrong type (`type_ok`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from taurl.errors import ConfigError


def unknown_option(key: str, names: Iterable[str], *, place: str = "", quote: bool = True,
                   holds: str = "") -> str:
    """``unknown option 'kep'; did you mean 'keep'?``: `key` (written under `place`, e.g.
    ``rl.``) with the nearest of `names`; `holds` lists what the mapping takes."""
    q = (lambda s: repr(s)) if quote else (lambda s: s)
    close = difflib.get_close_matches(str(key), list(names), n=1)
    return (f"unknown option {q(place + str(key))}"
            + (f"; did you mean {q(place + close[0])}?" if close else "")
            + (f" ({holds})" if holds else ""))


def option_class(f: dataclasses.Field) -> type | None:
    """The option class of a typed field (`taurl.recipe.options.typed`), or None; a class
    named as ``"module:Class"`` is imported here, when first needed."""
    where = f.metadata.get("options")
    if where is None or isinstance(where, type):
        return where
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def is_record(f: dataclasses.Field) -> bool:
    """Whether the config holds field `f` as an instance of its option class (the mapping
    options whose ``{}`` means "off" stay mappings: `taurl.recipe.options.typed_mapping`)."""
    return isinstance(f.metadata.get("options"), type)


def key_problems(place: str, cls: type, value: Any) -> list[str]:
    """The unknown keys (with the nearest known one) and wrong types of mapping `value` for
    option class `cls`; an instance of `cls` has its fields' types checked."""
    if isinstance(value, cls):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(cls)}
    if not isinstance(value, Mapping):
        return [f"{place} must be a mapping of its options (got {value!r})"]
    names = [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls)
    out = []
    for key, v in value.items():
        if key not in names:
            out.append(f"{place}: " + unknown_option(key, names,
                                                     holds=f"options: {', '.join(names)}"))
        elif not type_ok(v, hints[key]):
            out.append(f"{place}.{key} must be {type_name(hints[key])} (got {v!r})")
    return out


def record_value(cls: type, value: Mapping[str, Any]) -> Any:
    """`value` (keys checked) as an instance of `cls` (lists where the class holds tuples)."""
    hints = typing.get_type_hints(cls)
    return cls(**{k: tuple(v) if typing.get_origin(hints[k]) is tuple else v
                  for k, v in value.items()})


def as_record(place: str, cls: type, value: Any) -> Any:
    """`value` (a mapping, or already an instance) as an instance of `cls`; a ConfigError
    names every unknown key and wrong type."""
    if isinstance(value, cls):
        return value
    if problems := key_problems(place, cls, value):
        raise ConfigError(problems)
    return record_value(cls, value)


def record_mapping(value: Any) -> dict[str, Any]:
    """A record as its file writes it: the keys whose value differs from the default, so a
    default record is ``{}`` as before (tuples as lists)."""
    out = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if v != default:
            out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def type_ok(value: Any, hint: Any) -> bool:
    """Whether `value` (read from YAML, JSON or Python) fits type hint `hint`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    return isinstance(value, hint) if isinstance(hint, type) else True


def type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
