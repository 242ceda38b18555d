"""The scripted expert of code-v0: the family's reference solution, tested, then submitted.

`expert(task, rng, **quality)` returns the action texts, one per turn, exactly as the
policy should write them (Hermes ``<tool_call>`` JSON, the env's parser):

1. ``write_file`` solution.py — the reference solution (`tasks.reference_source`), or,
   with probability `p_bug`, a *draft with a planted bug*: one parameter of the instance
   replaced by another value of the family's parameter space, chosen so that at least
   one visible test fails (checked on the host against the reference; a bug the visible
   tests would not reveal is never planted, so every bug is one a tester can catch);
2. ``run_tests`` — unless, with probability `p_skip_tests`, the expert submits at once;
3. when the draft was buggy and the tests ran (and so failed): ``write_file`` the
   reference, ``run_tests`` again;
4. ``submit``.

A demonstration therefore succeeds unless the draft was buggy *and* the tests were
skipped: the demos' success rate is ``1 − p_bug · p_skip_tests``. This is the lever for
RL (as search-v0's ``p_skip_search``): SFT on such demos teaches the tool protocol and
the repair loop (a failing test report is followed by a rewrite), but also a bad habit —
submitting untested drafts `p_skip_tests` of the time, and drafting with a wrong
constant `p_bug` of the time. RL can find two strategies the demos do not commit to:
always run the tests before submitting (the repair loop then rescues a buggy draft), and
copy the prompt's constants faithfully in the first draft. The defaults are a perfect
expert (write, test, submit).

The two uniform draws are made in the same order for every knob setting, so with one
`rng` seed a worse setting only ever turns successful demos into failing ones (coupled
draws: the "degraded is worse" comparison is not noise).
"""

from __future__ import annotations

import json
import random
from typing import Any

from taurl.envs.code.tasks import (
    FAMILIES,
    SOLUTION_FILE,
    reference_function,
    reference_source,
    visible_cases,
)
from taurl.envs.core import Task
from taurl.errors import ConfigError

_BUG_DRAWS = 64  # tries to find a parameter change the visible tests reveal


def tool_call(name: str, **arguments: Any) -> str:
    """One action in the env's format: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``."""
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def planted_bug(task: Task, rng: random.Random) -> str | None:
    """solution.py with one parameter of the instance changed so that a visible test fails,
    or None when no such change was found in `_BUG_DRAWS` draws."""
    fam = FAMILIES[task.metadata["family"]]
    params = task.metadata["params"]
    cases = visible_cases(task)
    for _ in range(_BUG_DRAWS):
        other = fam.params(rng)
        key = rng.choice(sorted(params))
        if other[key] == params[key]:
            continue
        bugged = {**params, key: other[key]}
        # our own template with other constants: trusted host code
        fn = reference_function(fam, bugged)
        try:
            revealed = any(json.loads(json.dumps(fn(*json.loads(json.dumps(a))))) != want
                           for a, want in cases)
        except Exception:  # noqa: BLE001 — a draft that raises on a visible case is revealed too
            revealed = True
        if revealed:
            return fam.source.format(**bugged)
    return None


def quality_problems(p_bug: Any, p_skip_tests: Any) -> list[str]:
    return [f"{name} must be a probability in [0, 1], got {v!r}" for name, v in
            (("p_bug", p_bug), ("p_skip_tests", p_skip_tests))
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1]


def expert(task: Task, rng: random.Random, *, p_bug: float = 0.0,
           p_skip_tests: float = 0.0) -> list[str]:
    """The expert's actions for `task` (module docstring). `p_bug`: chance of a first draft
    with a planted bug the visible tests reveal; `p_skip_tests`: chance of submitting the
    first draft without running the tests (an untested buggy draft fails)."""
    if problems := quality_problems(p_bug, p_skip_tests):
        raise ConfigError(problems)
    u_bug, u_skip = rng.random(), rng.random()  # always both, in this order (coupled draws)
    reference = reference_source(task)
    draft = planted_bug(task, rng) if u_bug < p_bug else None
    write = lambda src: tool_call("write_file", path=SOLUTION_FILE, content=src)  # noqa: E731
    actions = [write(draft or reference)]
    if u_skip < p_skip_tests:
        return actions + [tool_call("submit")]
    actions.append(tool_call("run_tests"))
    if draft is not None:  # the tests failed: repair, re-test
        actions += [write(reference), tool_call("run_tests")]
    return actions + [tool_call("submit")]
