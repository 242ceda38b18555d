"""`plain_asdict`: `dataclasses.asdict` without its per-leaf deepcopy, for the hot path.

Split from `taurl.data.trajectory` (whose `Trajectory.to_dict` uses it): it is a generic
conversion of any dataclass tree, with nothing of the trajectory record in it.
"""

from __future__ import annotations

from dataclasses import _asdict_inner, fields  # type: ignore[attr-defined]
from typing import Any

_ATOMIC = frozenset({int, float, str, bool, type(None)})


def plain_asdict(obj: Any) -> Any:
    """`dataclasses.asdict(obj)`, equal value for value and type for type, without its
    per-leaf deepcopy calls (the ledger converts every record once or twice on the rollout
    hot path: ~1 ms per episode of ~80 tokens, most of it asdict walking token ids).

    Exact built-in containers of atomic leaves are copied in one C-level pass; every other
    type (subclasses, namedtuples, arbitrary objects) goes through asdict's own code.
    """
    t = type(obj)
    if t in _ATOMIC:
        return obj
    if t is tuple or t is list:
        if _ATOMIC.issuperset(map(type, obj)):
            return t(obj)
        return t(plain_asdict(v) for v in obj)
    if t is dict:
        return {plain_asdict(k): plain_asdict(v) for k, v in obj.items()}
    if hasattr(t, "__dataclass_fields__") and not isinstance(obj, type):
        return {f.name: plain_asdict(getattr(obj, f.name)) for f in fields(obj)}
    return _asdict_inner(obj, dict)
