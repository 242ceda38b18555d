"""The rollout/learn overhead cuts are exact: each fast path equals its slow reference."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import namedtuple
from dataclasses import dataclass

import pytest
from tests.test_ledger import make_traj

from taurl.ledger import Ledger, _json_problem
from taurl.trajectory import Trajectory, plain_asdict

Point = namedtuple("Point", "x y")


class Tags(list):
    pass


@dataclass(frozen=True)
class Inner:
    ids: tuple
    extra: object


def _same(a, b) -> bool:
    """Equal values and equal types all the way down (asdict keeps tuples as tuples)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("obj", [
    make_traj(),
    make_traj(correct=False, versions=(0, 0)),
    Inner((1, 2.5, True, None, "x"), {"k": [1, (2, 3)], (1, 2): Point(1, [2])}),
    Inner((), Tags([1, 2])),
    Inner((float("nan"), float("inf")), {"deep": [{"a": (Inner((1,), None),)}]}),
])
def test_plain_asdict_equals_dataclasses_asdict(obj):
    assert _same(plain_asdict(obj), dataclasses.asdict(obj))


def test_to_dict_round_trip_unchanged():
    t = make_traj()
    d = t.to_dict()
    assert _same(d, {**dataclasses.asdict(t), "stop_reason": str.__str__(t.stop_reason)})
    assert Trajectory.from_dict(json.loads(json.dumps(d))) == t


@pytest.mark.parametrize("x", [
    [1, 2, 3], (True, 0, 7), [], [0.5, -1e30, 3], [1.0, float("nan")], [float("inf"), 2],
    [1, None, 2.0], [1, "a"], [1, 2.0, "\ud800"], [Point(1, 2)], [[1, 2], [3.0, float("-inf")]],
    [Tags([1])], [1, {"a": float("nan")}], [{1: 2}],
])
@pytest.mark.parametrize("finite", [False, True])
def test_json_problem_fast_path_matches_element_walk(x, finite):
    def slow(v, where="record"):  # the walk without the fast path (ledger's rules, element by element)
        if isinstance(v, (list, tuple)):
            return next((p for i, e in enumerate(v) if (p := slow(e, f"{where}[{i}]"))), None)
        return _json_problem(v, finite, where)
    assert _json_problem(x, finite) == slow(x)


def test_ledger_stores_the_same_json():
    """The stored record is the canonical JSON of the trajectory (compared to asdict's)."""
    t = make_traj()
    with Ledger(":memory:") as led:
        led.append(t)
        assert led.get(t.episode_id) == t
    ref = json.loads(json.dumps({**dataclasses.asdict(t), "stop_reason": str.__str__(t.stop_reason)}))
    assert json.loads(json.dumps(t.to_dict())) == ref
