"""Environment registry: ``taurl.envs.make("search-v0", **cfg)``, its task source, expert,
verifier and policy hooks (`taurl.envs.spec.EnvSpec`).

Environments come from three places, all through `register`:
* taurl's own (`taurl.envs`);
* a user's module, imported by name: ``taurl train --import my_pkg.envs`` calls
  `import_env_modules(["my_pkg.envs"])`, and the module calls `taurl.envs.register` at import;
* installed packages that declare an entry point in the ``taurl.envs`` group
  (``[project.entry-points."taurl.envs"] my-env = "my_pkg.envs:register_all"``): the entry
  point is loaded (and called, when it is a function) by `load_entry_points`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any

from taurl.envs.core import Env, Task
from taurl.envs.spec import EnvSpec, Expert, TaskSource, Verifier
from taurl.errors import ConfigError, Error, UnknownEnvError

log = logging.getLogger("taurl.envs")
ENTRY_POINT_GROUP = "taurl.envs"
_SPECS: dict[str, EnvSpec] = {}
_SOURCE = ["taurl"]  # who is registering right now (a module or entry point being loaded)
_LOADED_ENTRY_POINTS = [False]


def register(name: str, factory: Callable[..., Env] | str, tasks: TaskSource | str | None = None, *,
             expert: Expert | str | None = None,
             verifier: Callable[[], Verifier] | str | None = None,
             policy_hooks: Any = None, tool_expert: Expert | str | None = None) -> None:
    """Register `factory` under `name` (``family-vN``) with its optional plug points.

    tasks: ``tasks(split, n, seed, **options) -> list[Task]``, the env's task source; its
    keyword options (e.g. search-v0's ``families``, ``split_by``) are whatever it declares.
    expert: ``expert(task, rng, **options) -> [action text, ...]`` (SFT demonstrations).
    verifier: a zero-argument callable returning the evaluator's verifier instance.
    policy_hooks: an object with ``tokenizer_texts`` and/or ``warmup`` (see EnvSpec), or its
    class (instantiated on first use).
    tool_expert: the expert in the proxy's wire format (tool calls), ``(task, rng, **options)
    -> [reply text, ...]`` one per model call: demonstrations for agents behind `taurl.proxy`.
    Each of them may be a ``"module:attr"`` string, imported on first use (Gymnasium's entry
    points: ``import taurl`` stays light, an env's heavy dependencies load only when used).
    """
    if name in _SPECS:
        raise ConfigError(f"environment {name!r} is already registered (by {_SPECS[name].source}); "
                          f"{_SOURCE[-1]} registers it again: give your env another name (e.g. "
                          f"'{name.rsplit('-v', 1)[0]}-mine-v0'), or register it once")
    _SPECS[name] = EnvSpec(name=name, factory=factory, tasks=tasks, expert=expert,
                           verifier=verifier,
                           policy_hooks=policy_hooks, tool_expert=tool_expert, source=_SOURCE[-1])


def registered() -> list[str]:
    load_entry_points()
    return sorted(_SPECS)


def _check(name: str) -> None:
    if name not in _SPECS:
        load_entry_points()
    if name not in _SPECS:
        close = difflib.get_close_matches(name, _SPECS, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownEnvError(f"no environment named {name!r}.{hint} Registered: "
                              f"{', '.join(sorted(_SPECS))}. An env of your own: `--import "
                              "your.module` (a module that calls taurl.envs.register) or a "
                              "`taurl.envs` entry point of an installed package")


_LAZY = ("factory", "tasks", "expert", "verifier", "policy_hooks", "tool_expert")


def _load(ref: Any) -> Any:
    """A ``"module:attr"`` reference, imported; anything else as it is."""
    if not isinstance(ref, str):
        return ref
    mod, _, attr = ref.partition(":")
    return getattr(importlib.import_module(mod), attr)


def spec(name: str) -> EnvSpec:
    """The registered spec of `name` (unknown names get a "did you mean" hint); its
    ``"module:attr"`` parts are imported, and a policy-hooks class instantiated, once."""
    _check(name)
    s = _SPECS[name]
    parts = {k: _load(getattr(s, k)) for k in _LAZY}
    if isinstance(parts["policy_hooks"], type):
        parts["policy_hooks"] = parts["policy_hooks"]()
    if any(parts[k] is not getattr(s, k) for k in _LAZY):
        s = _SPECS[name] = dataclasses.replace(s, **parts)
    return s


def make(name: str, **config: Any) -> Env:
    """Build a registered environment; unknown names get a "did you mean" hint."""
    return spec(name).factory(**config)


def env_option_problems(name: str, options: dict[str, Any]) -> list[str]:
    """Keyword options the env's factory does not accept (checked by signature, before any
    work; a factory that takes ``**kwargs`` accepts everything)."""
    return signature_problems(spec(name).factory, options, f"{name}", "env option", set())


def task_option_problems(name: str, options: dict[str, Any]) -> list[str]:
    """What is wrong with `options` for env `name`'s task source (empty when all is well)."""
    s = spec(name)
    if s.tasks is None:
        return [f"environment {name!r} has no registered task source; give `tasks: FILE.jsonl` "
                "instead"]
    fixed = {"split", "n", "seed", "env_config"}
    problems = [f"task option {o!r} is not an option: it is make_tasks' own argument"
                for o in sorted(set(options) & fixed)]
    return problems + signature_problems(s.tasks, options, f"{name}'s task source", "option", fixed)


def expert_option_problems(name: str, options: dict[str, Any]) -> list[str]:
    s = spec(name)
    if s.expert is None:
        return [f"environment {name!r} has no expert; use sft: none, sft: rejection or sft_data: "
                "FILE"] if options else []
    return signature_problems(s.expert, options, f"{name}'s expert", "option", {"task", "rng"})


def signature_problems(fn: Callable[..., Any], options: dict[str, Any], owner: str, what: str,
                       fixed: set[str]) -> list[str]:
    """`options` that `fn` does not accept as keywords (besides the `fixed` ones the caller
    passes itself), each with a "did you mean"; none when `fn` takes ``**kwargs``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    accepted = sorted(set(params) - fixed - {"self"})
    out = []
    for o in sorted(set(options) - set(params) - fixed):
        close = difflib.get_close_matches(o, accepted, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        out.append(f"{owner} has no {what} {o!r}{hint}; its options: "
                   f"{', '.join(accepted) or 'none'}")
    return out


def make_tasks(name: str, split: str, n: int, seed: int = 0, *,
               env_config: dict[str, Any] | None = None, **options: Any) -> list[Task]:
    """`n` tasks of `split` from the env's registered task source, with its `options`.

    A task source that declares an ``env_config`` parameter also gets the env's options (an
    adapter whose tasks depend on them: reasoning-gym's ``dataset``, an OpenEnv server)."""
    s = spec(name)
    if s.tasks is None:
        raise UnknownEnvError(f"environment {name!r} has no registered task source; pass tasks "
                              "yourself")
    if problems := task_option_problems(name, options):
        raise ConfigError(problems)
    if wants_env_config(s.tasks):
        options["env_config"] = dict(env_config or {})
    return s.tasks(split, n=n, seed=seed, **options)


def wants_env_config(fn: Callable[..., Any]) -> bool:
    """Does a task source take the env's options (an ``env_config`` parameter)?"""
    try:
        return "env_config" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def import_env_modules(modules: Iterable[str]) -> list[str]:
    """Import each module (``my_pkg.envs``) so that its `register` calls run; returns the
    names it registered. A module that cannot be imported is a clear error."""
    new: list[str] = []
    if modules and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: a module beside you is importable
    for mod in modules:
        before = set(_SPECS)
        _SOURCE.append(mod)
        try:
            importlib.import_module(mod)
        except Error:
            raise  # taurl's own (a duplicate name, a bad option): it says what to fix
        except Exception as e:  # noqa: BLE001 — every failure is reported with where it happened
            raise Error(_import_failure(mod, e)) from e
        finally:
            _SOURCE.pop()
        new += sorted(set(_SPECS) - before)
    return new


def _import_failure(mod: str, e: Exception) -> str:
    """What went wrong importing `mod`: not found (where to run from), or its own error
    (shown as raised, with the file and line inside the module where it happened)."""
    missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
    if missing and (mod == missing or mod.startswith(missing + ".")):
        return (f"--import {mod}: {e}. The module must be importable from the current directory or "
                "the venv (run from its parent directory, or `pip install -e` its package)")
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename
              and not f.filename.startswith("<frozen")]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    if isinstance(e, SyntaxError) and e.filename:
        where = f" at {e.filename}:{e.lineno}"
    return (f"--import {mod}: importing it raised {type(e).__name__}: {e}{where}. The module was "
            "found; fix that error (a missing dependency: install it into this venv)")


def load_entry_points() -> list[str]:
    """Load the ``taurl.envs`` entry points of installed packages once; returns new names.
    An entry point that fails to load is logged and skipped (one broken plugin must not
    hide every env)."""
    if _LOADED_ENTRY_POINTS[0]:
        return []
    _LOADED_ENTRY_POINTS[0] = True
    before = set(_SPECS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        _SOURCE.append(f"entry point {ep.name} ({ep.value})")
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type):
                obj()
        except Exception as e:  # noqa: BLE001 — a broken plugin is reported, the rest still load
            log.warning("taurl.envs entry point %s (%s) failed to load: %s: %s", ep.name, ep.value,
                        type(e).__name__, e)
        finally:
            _SOURCE.pop()
    return sorted(set(_SPECS) - before)
