"""Procedurally generated Python function-writing tasks, with visible and hidden tests.

A task is a *family* (what the function does) with drawn *parameters* (the constants that
make each instance different: a multiplier, a shift, a separator …), so a policy cannot
memorize answers across tasks. Each family holds the reference solution as source text
with the parameters filled in (`reference_source`); the expected outputs of every test
case come from running that source on the host (trusted code, never in a sandbox).

Cases: 3 *visible* ones (in the agent's workspace as ``test_visible.py``) and
`HIDDEN_CASES` *hidden* ones (edge cases first, then random inputs, none equal to a
visible input). Both are drawn from ``random.Random(f"{task_id}:visible|hidden")``, so
the hidden cases are a pure function of the task: the verifier regenerates them and
checks their hash against ``metadata["hidden_sha256"]`` recorded at generation.

Splits: an *instance* is a family with its parameters (one instance = one task: its id,
prompt and test cases are functions of the two). With ``h = sha256(SPLIT_SEED:family:params)
mod 100``, the instance is ``holdout`` when ``h < HOLDOUT_PERCENT``, ``validation`` when
``h < HOLDOUT_PERCENT + VALIDATION_PERCENT``, else ``train``: each instance is in exactly
one split, so a parameter set seen in training (or tuning) is never scored on the holdout.
Families with few instances (``window_sums`` has 3, ``rotate`` 9) may have none in a small
split; `generate_tasks` then fills the split from the other families.
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taurl.envs.core import Task, task_request_problems
from taurl.errors import ConfigError

ENV_NAME = "code-v0"
SPLITS = ("train", "validation", "holdout")
SPLIT_SEED = "taurl-code-v0"
HOLDOUT_PERCENT = 20
VALIDATION_PERCENT = 10  # taken from what was train: the holdout is the same set as before
VISIBLE_CASES = 3
HIDDEN_CASES = 12
SOLUTION_FILE = "solution.py"
VISIBLE_TEST_FILE = "test_visible.py"
PASS_MARKER = "ALL VISIBLE TESTS PASSED"
_MAX_DRAWS = 400  # draws without a new task before a family counts as used up


def _ints(rng: random.Random, lo: int = -20, hi: int = 20,
          n: tuple[int, int] = (1, 8)) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(*n))]


def _word(rng: random.Random, alphabet: str = string.ascii_lowercase + " ,.!",
          n: tuple[int, int] = (1, 12)) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(*n)))


def _affine_params(r: random.Random) -> dict[str, Any]:
    m = r.randint(2, 5)
    return {"a": r.choice([-5, -4, -3, -2, 2, 3, 4, 5]), "b": r.randint(-9, 9), "m": m,
            "r": r.randint(0, m - 1)}


def _fizz_params(r: random.Random) -> dict[str, Any]:
    x = r.randint(2, 7)
    return {"x": x, "y": r.choice([y for y in range(2, 8) if y != x]),
            "w1": r.choice(["Fizz", "Zap", "Bing", "Pop"]),
            "w2": r.choice(["Buzz", "Zing", "Bong", "Wow"])}


@dataclass(frozen=True)
class Family:
    """A task template. `source` is the reference solution with {param} slots."""

    name: str
    func: str
    signature: str  # e.g. "(xs: list[int]) -> list[int]"
    describe: str  # the spec the agent reads, with {param} slots
    params: Callable[[random.Random], dict[str, Any]]
    inputs: Callable[[random.Random, dict[str, Any]], tuple]
    edge: tuple[tuple, ...]  # always-tested argument tuples
    source: str


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("affine_filter", "transform", "(xs: list[int]) -> list[int]",
           "Return a*x + b with a={a}, b={b} for every x in xs with x % {m} == {r} (Python's %), "
           "in order.",
           _affine_params,
           lambda r, p: (_ints(r),), (([],), ([0],)),
           "def transform(xs):\n    return [{a} * x + {b} for x in xs if x % {m} == {r}]\n"),
    Family("digit_score", "score", "(n: int) -> int",
           "Return (the sum of the decimal digits of abs(n)) * {k} modulo {q}.",
           lambda r: {"k": r.randint(2, 9), "q": r.randint(7, 97)},
           lambda r, p: (r.randint(-10**6, 10**6),), ((0,), (-7,)),
           "def score(n):\n    return sum(int(c) for c in str(abs(n))) * {k} % {q}\n"),
    Family("caesar", "shift", "(s: str) -> str",
           "Shift every lowercase ASCII letter of s forward by {k} places in the alphabet, "
           "wrapping from z to a; leave every other character unchanged.",
           lambda r: {"k": r.randint(1, 25)},
           lambda r, p: (_word(r, string.ascii_letters + " .!"),), (("",), ("xyz",)),
           "def shift(s):\n    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= "
           "'z' else c for c in s)\n"),
    Family("run_length", "encode", "(s: str) -> str",
           "Run-length encode s: each maximal run of one character becomes {order}; join the "
           "pieces with {sep!r}. The empty string encodes to ''.",
           lambda r: {"sep": r.choice(["", "-", ",", "|", ";", ":", "/", " "]),
                      "order": r.choice(["the character followed by the run's length",
                                         "the run's length followed by the character"])},
           lambda r, p: ("".join(r.choice("aab") * r.randint(1, 4) for _ in range(r.randint(1, 5))),
                         ),
           (("",), ("a",)),
           "def encode(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
           "        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
           "        out.append(s[i] + str(j - i) if {order!r}.startswith('the character') else "
           "str(j - i) + s[i])\n        i = j\n    return {sep!r}.join(out)\n"),
    Family("recurrence", "seq", "(n: int) -> int",
           "s(0) = {u}, s(1) = {v}, s(n) = {p}*s(n-1) + {q}*s(n-2) for n >= 2. Return s(n) modulo "
           "1000003 (n >= 0).",
           lambda r: {"u": r.randint(0, 5), "v": r.randint(0, 5), "p": r.randint(1, 3),
                      "q": r.randint(1, 3)},
           lambda r, p: (r.randint(2, 60),), ((0,), (1,)),
           "def seq(n):\n    a, b = {u}, {v}\n    for _ in range(n):\n        a, b = b, {p} * b + "
           "{q} * a\n    return a % 1000003\n"),
    Family("fizz_words", "label", "(n: int) -> str",
           "Return {w1!r} + {w2!r} if n is divisible by both {x} and {y}, {w1!r} if only by {x}, "
           "{w2!r} if only by {y}, else str(n).",
           _fizz_params,
           lambda r, p: (r.randint(-50, 200),), ((0,), (1,)),
           "def label(n):\n    s = ''\n    if n % {x} == 0:\n        s += {w1!r}\n    if n % {y} "
           "== 0:\n        s += {w2!r}\n    return s or str(n)\n"),
    Family("window_sums", "window_sums", "(xs: list[int]) -> list[int]",
           "Return the sums of every window of {k} consecutive items of xs, left to right "
           "(an empty list when xs has fewer than {k} items).",
           lambda r: {"k": r.randint(2, 4)},
           lambda r, p: (_ints(r, n=(0, 9)),), (([],), ([5],)),
           "def window_sums(xs):\n    return [sum(xs[i:i + {k}]) for i in range(len(xs) - {k} + "
           "1)]\n"),
    Family("unique_mod", "unique_by_mod", "(xs: list[int]) -> list[int]",
           "Keep only the first item of xs of each residue class modulo {m} (Python's %), in "
           "order.",
           lambda r: {"m": r.randint(2, 9)},
           lambda r, p: (_ints(r, n=(0, 10)),), (([],), ([3, 3],)),
           "def unique_by_mod(xs):\n    seen = set()\n    out = []\n    for x in xs:\n"
           "        if x % {m} not in seen:\n            seen.add(x % {m})\n            "
           "out.append(x)\n    return out\n"),
    Family("rotate", "rotate", "(xs: list[int]) -> list[int]",
           "Rotate xs right by {k} positions (k modulo the length; an empty list stays empty).",
           lambda r: {"k": r.randint(1, 9)},
           lambda r, p: (_ints(r, n=(0, 8)),), (([],), ([1],)),
           "def rotate(xs):\n    if not xs:\n        return []\n    k = {k} % len(xs)\n"
           "    return xs[len(xs) - k:] + xs[:len(xs) - k]\n"),
    Family("count_chars", "count", "(s: str) -> int",
           "Return how many characters of s are in the set {chars!r} (case-sensitive).",
           lambda r: {"chars": "".join(sorted(r.sample(string.ascii_lowercase, 3)))},
           lambda r, p: (_word(r, string.ascii_lowercase + p["chars"] * 3 + "AB "),),
           (("",), ("zzz",)), "def count(s):\n    return sum(1 for c in s if c in {chars!r})\n"),
)}


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _split_of(family: str, params: dict[str, Any]) -> str:
    h = int(hashlib.sha256(f"{SPLIT_SEED}:{family}:{_canon(params)}".encode()).hexdigest()[:8], 16)
    h %= 100
    if h < HOLDOUT_PERCENT:
        return "holdout"
    return "validation" if h < HOLDOUT_PERCENT + VALIDATION_PERCENT else "train"


def reference_source(task: Task) -> str:
    """The reference solution of `task` (a complete ``solution.py``)."""
    fam = FAMILIES[task.metadata["family"]]
    return fam.source.format(**task.metadata["params"])


def reference_function(family: Family, params: dict[str, Any]) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(family.source.format(**params), namespace)  # our own template: trusted host code
    return namespace[family.func]


def _cases(family: Family, params: dict[str, Any], task_id: str) -> tuple[list, list]:
    """(visible, hidden) lists of [args, expected], JSON-normalized (tuples become lists)."""
    ref = reference_function(family, params)
    rng_v, rng_h = random.Random(f"{task_id}:visible"), random.Random(f"{task_id}:hidden")
    visible: list[list] = []
    seen: set[str] = set()
    while len(visible) < VISIBLE_CASES:
        args = list(family.inputs(rng_v, params))
        if _canon(args) not in seen:
            seen.add(_canon(args))
            visible.append(args)
    hidden: list[list] = []
    for args in [list(e) for e in family.edge] + [list(family.inputs(rng_h, params))
                                                  for _ in range(200)]:
        if len(hidden) >= HIDDEN_CASES:
            break
        if _canon(args) not in seen:
            seen.add(_canon(args))
            hidden.append(args)

    def with_expected(cases: list[list]) -> list[list]:
        return [json.loads(_canon([a, ref(*json.loads(_canon(a)))])) for a in cases]

    return with_expected(visible), with_expected(hidden)


def hidden_cases(task: Task) -> list[list]:
    """[args, expected] of the hidden tests, regenerated from the task (module docstring)."""
    return _cases(FAMILIES[task.metadata["family"]], task.metadata["params"], task.task_id)[1]


def visible_cases(task: Task) -> list[list]:
    return _cases(FAMILIES[task.metadata["family"]], task.metadata["params"], task.task_id)[0]


def cases_sha256(cases: list[list]) -> str:
    return hashlib.sha256(_canon(cases).encode()).hexdigest()


_VISIBLE_TEMPLATE = """from solution import FUNC

CASES = CASES_REPR

failed = 0
for args, want in CASES:
    call = "FUNC(" + ", ".join(map(repr, args)) + ")"
    try:
        got = FUNC(*args)
    except Exception as e:
        print(f"FAIL {call} raised {e!r}")
        failed += 1
        continue
    if got != want:
        print(f"FAIL {call} returned {got!r}, expected {want!r}")
        failed += 1
    else:
        print(f"ok   {call} == {want!r}")
print(MARKER if not failed else f"{failed} of {len(CASES)} visible tests failed")
"""


def visible_test_source(task: Task) -> str:
    """``test_visible.py``: a plain-Python runner of the visible cases (no pytest needed)."""
    func = FAMILIES[task.metadata["family"]].func
    return (_VISIBLE_TEMPLATE.replace("FUNC", func).replace("CASES_REPR", repr(visible_cases(task)))
            .replace("MARKER", repr(PASS_MARKER)))


def stub_source(task: Task) -> str:
    fam = FAMILIES[task.metadata["family"]]
    doc = fam.describe.format(**task.metadata["params"])
    return f'def {fam.func}{fam.signature}:\n    """{doc}"""\n    raise NotImplementedError\n'


def _prompt(fam: Family, params: dict[str, Any]) -> str:
    return (f"Write the Python function `{fam.func}{fam.signature}` in {SOLUTION_FILE}.\n\n"
            f"{fam.describe.format(**params)}\n\n"
            f"{SOLUTION_FILE} holds a stub; {VISIBLE_TEST_FILE} has a few example tests (run_tests "
            "runs them). Hidden tests decide the result. Call submit when you are done.")


def make_task(family: str, params: dict[str, Any]) -> Task:
    """The task of `family` with `params` (its split follows from them)."""
    fam = FAMILIES[family]
    key = hashlib.sha256(f"{family}:{_canon(params)}".encode()).hexdigest()[:10]
    task_id = f"code-{family}-{key}"
    visible, hidden = _cases(fam, params, task_id)
    meta = {"family": family, "params": dict(params), "func": fam.func,
            "visible_sha256": cases_sha256(visible), "hidden_sha256": cases_sha256(hidden)}
    return Task(task_id, _prompt(fam, params), (), _split_of(family, params), ENV_NAME, meta)


def generate_tasks(split: str, n: int = 100, seed: int = 0,
                   families: list[str] | None = None) -> list[Task]:
    """`n` distinct tasks of `split`, families interleaved round robin. Same arguments, same
    list."""
    names, problems = task_request_problems(split, SPLITS, families, FAMILIES, n)
    if problems:
        raise ConfigError(problems)
    rng = random.Random(f"{SPLIT_SEED}:{split}:{seed}")
    out: list[Task] = []
    seen: set[str] = set()
    live = list(names)  # families not yet exhausted for this split
    turn = 0
    while len(out) < n and live:
        fam = FAMILIES[live[turn % len(live)]]
        for _ in range(_MAX_DRAWS):
            params = fam.params(rng)
            key = f"{fam.name}:{_canon(params)}"
            if key not in seen and _split_of(fam.name, params) == split:
                seen.add(key)
                out.append(make_task(fam.name, params))
                turn += 1
                break
        else:  # the family's parameter space is used up (for this split)
            live.remove(fam.name)
    if len(out) < n:
        raise ConfigError(f"only {len(out)} distinct {split} tasks exist in families {names}; ask "
                          "for fewer")
    return out
