"""Structural checks of a JSON record against a dataclass: types and required keys only.

Nothing is coerced: a string where a number belongs is an error, not a conversion. The
semantics of a record are checked elsewhere (`taurl.data.trajectory.check_trajectory`).
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, fields
from typing import Any

from taurl.errors import ContractError

_NUM = (int, float)
# JSON types accepted for each annotation (annotations are strings under __future__)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": _NUM, "str": (str,), "bool": (bool,), "None": (type(None),),
    "dict": (dict,), "ToolReceipt": (dict,), "tuple": (list,), "list": (list,),
}


@functools.cache
def _spec(cls: type) -> dict[str, tuple[tuple[type, ...], bool]]:
    """field -> (accepted JSON types, required), read off the dataclass so it never drifts."""
    out = {}
    for f in fields(cls):
        names = [part.strip().split("[")[0] for part in str(f.type).split("|")]
        # an annotation we do not know accepts any JSON value rather than refusing good records
        types = tuple(t for n in names for t in _JSON_TYPES.get(n, (object,)))
        required = f.default is MISSING and f.default_factory is MISSING
        out[f.name] = (types, required)
    return out


def _is(v: Any, typ: type | tuple[type, ...]) -> bool:
    """isinstance, except that a bool is not a number unless `typ` names bool."""
    types = typ if isinstance(typ, tuple) else (typ,)
    if object in types:
        return True
    if isinstance(v, bool) and bool not in types:
        return False
    return isinstance(v, types)


def _need(d: dict, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise ContractError("schema", f"{where}: missing field {key!r}")
    v = d[key]
    if not _is(v, typ):
        raise ContractError("schema", f"{where}: field {key!r} has type {type(v).__name__}")
    return v


def _opt(d: dict, key: str, typ: type | tuple[type, ...], default: Any, where: str) -> Any:
    return _need(d, key, typ, where) if key in d else default


def _fields(d: Any, spec: dict[str, tuple[Any, bool]], where: str) -> dict[str, Any]:
    """The keyword arguments of a record described by `spec`, type-checked."""
    if not isinstance(d, dict):
        raise ContractError("schema", f"{where} is a JSON object, got {type(d).__name__}")
    unknown = sorted(str(k) for k in d if k not in spec)
    if unknown:
        raise ContractError("schema", f"{where}: unknown field(s) {unknown}; known: {sorted(spec)}")
    return {k: _need(d, k, typ, where) for k, (typ, required) in spec.items() if required or k in d}


def _num_map(d: dict, key: str, where: str) -> dict[str, float]:
    m = _opt(d, key, dict, {}, where)
    for k, v in m.items():
        if not isinstance(k, str) or not _is(v, _NUM):
            raise ContractError("schema", f"{where}: {key} maps names to numbers; got {k!r}: "
                                          f"{type(v).__name__}")
    return {k: float(v) for k, v in m.items()}
