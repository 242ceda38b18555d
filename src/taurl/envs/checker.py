"""`check_env`: does an environment keep the Env protocol? (after Gymnasium's env_checker)

Checks, in order, each failure an `EnvCheckError` that says what to fix:

1. declared attributes: ``name`` is ``family-vN``, ``version`` non-empty,
   ``observation_style`` is "inline" or "messages" (inline envs declare `stop` strings),
   ``system_prompt`` is a string, every tool is an OpenAI-format JSON-Schema function;
   an ``astep``, if offered, is a coroutine function;
2. `step` before `reset` raises `ResetNeeded` (pass a fresh env);
3. `reset` returns ``(str, dict)``; ``info["provenance"]``, if present, is a JSON object;
4. every `step` returns ``(str, real, bool, bool, dict)``, never terminated and
   truncated at once, with ``info["action"]["kind"]`` and ``info["invalid"]`` (bool),
   a `ToolReceipt` when ``info["receipt"]`` is present, and the other `StepInfo` keys
   of the right types; the step that ends the episode names why in
   ``info["stop_reason"]`` — exactly the contract the loop holds (`taurl.rollout.loop`): a
   snake_case name, and one of the loop's own reasons only with its own kind;
5. the episode ends (repeating the last action) within `max_steps`, and then `step`
   raises `ResetNeeded`;
6. the same seed and actions give the same observations, rewards, flags, stop reasons
   and provenance.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import re
from collections.abc import Sequence
from typing import Any

from taurl.data.trajectory import NAME_PATTERN as REASON_PATTERN
from taurl.data.trajectory import StopReason, ToolReceipt
from taurl.envs.core import Env, Task
from taurl.errors import EnvCheckError, ResetNeeded

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*-v\d+$")
DEFAULT_ACTIONS = ("", "hello", "<answer>unknown</answer>")


def check_tool(tool: Any, where: str = "tool") -> None:
    """Raise EnvCheckError unless `tool` is {"type": "function", "function": {"name",
    "description", "parameters": {"type": "object", ...}}} with well-formed properties."""
    fix = ('declare tools as {"type": "function", "function": {"name", "description", '
           '"parameters": {"type": "object", "properties": {...}}}}')
    if (not isinstance(tool, dict) or tool.get("type") != "function"
        or not isinstance(tool.get("function"), dict)):
        raise EnvCheckError(f"{where} is not a function declaration; {fix}")
    fn = tool["function"]
    if not isinstance(fn.get("name"), str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", fn["name"]):
        raise EnvCheckError(f"{where}: name must be 1-64 letters, digits, '_' or '-', got "
                            f"{fn.get('name')!r}")
    where = f"tool {fn['name']!r}"
    if not isinstance(fn.get("description"), str) or not fn["description"].strip():
        raise EnvCheckError(f"{where} has no description; the model reads it to decide when to "
                            "call the tool")
    params = fn.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        raise EnvCheckError(f'{where}: parameters must be a JSON Schema with "type": "object"; '
                            f'{fix}')
    props = params.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(v, dict) and "type" in v
                                              for v in props.values()):
        raise EnvCheckError(f'{where}: "properties" must map each argument name to a schema with a '
                            '"type"')
    required = params.get("required", [])
    if not isinstance(required, list) or any(r not in props for r in required):
        raise EnvCheckError(f'{where}: "required" must list argument names declared in '
                            f'"properties", got {required!r}')


def _check_attributes(env: Env) -> None:
    name = getattr(env, "name", None)
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise EnvCheckError(f"env name {name!r} must look like 'family-vN' (e.g. 'search-v0')")
    if not isinstance(getattr(env, "version", None), str) or not env.version:
        raise EnvCheckError(f"{name}: version must be a non-empty string; bump it when rewards or "
                            "observations change meaning")
    if getattr(env, "observation_style", None) not in ("inline", "messages"):
        raise EnvCheckError(f"{name}: observation_style must be 'inline' or 'messages', got "
                            f"{getattr(env, 'observation_style', None)!r}")
    stop = getattr(env, "stop", None)
    if not isinstance(stop, tuple) or not all(isinstance(s, str) and s for s in stop):
        raise EnvCheckError(f"{name}: stop must be a tuple of non-empty strings, got {stop!r}")
    if env.observation_style == "inline" and not stop:
        raise EnvCheckError(f"{name}: an inline env must declare the stop strings that end an "
                            "action")
    if not isinstance(getattr(env, "system_prompt", None), str):
        raise EnvCheckError(f"{name}: system_prompt must be a string")
    tools = getattr(env, "tools", None)
    if not isinstance(tools, list):
        raise EnvCheckError(f"{name}: tools must be a list of JSON-Schema function declarations")
    for i, tool in enumerate(tools):
        check_tool(tool, f"{name}: tool {i}")
    astep = getattr(env, "astep", None)
    if astep is not None and not inspect.iscoroutinefunction(astep):
        raise EnvCheckError(f"{name}: astep must be an async def (the loop awaits it); remove it "
                            "to use step only")


def check_stop_reason(reason: Any, terminated: bool, where: str) -> None:
    """Raise EnvCheckError unless `reason` is what the loop accepts for an episode that
    ended with `terminated` (else truncated) — the shared stop-reason contract."""
    if not isinstance(reason, str) or not REASON_PATTERN.match(reason):
        raise EnvCheckError(f'{where}: info["stop_reason"] {reason!r} must be a snake_case name '
                            "(lowercase letters, digits, '_'), e.g. 'answered', 'goal', 'fell'")
    kind = StopReason(reason).kind
    if kind is not None and (kind == "termination") != terminated:
        flag = "terminated" if terminated else "truncated"
        raise EnvCheckError(f'{where}: info["stop_reason"] {reason!r} is one of the loop\'s '
                            f'{kind}s but the '
                            f"env set {flag}=True; name the env's own reason differently or set "
                            "the matching flag")


def check_provenance(info: dict[str, Any], where: str) -> None:
    """Raise EnvCheckError unless ``info["provenance"]`` (if present) is a JSON object."""
    if "provenance" not in info:
        return
    prov = info["provenance"]
    if not isinstance(prov, dict) or not all(isinstance(k, str) for k in prov):
        raise EnvCheckError(f'{where}: info["provenance"] must be a dict with string keys, e.g. '
                            '{"corpus_fingerprint": "3f2a…"}')
    try:
        json.dumps(prov, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise EnvCheckError(f'{where}: info["provenance"] must hold only JSON values (str, int, '
                            'float, bool, '
                            f"None, list, dict) so the ledger can store it: {e}") from None


def _check_step(name: str, out: Any, i: int) -> tuple[str, float, bool, bool, Any]:
    where = f"{name}: step {i}"
    if not isinstance(out, tuple) or len(out) != 5:
        raise EnvCheckError(f"{where} must return (observation, reward, terminated, truncated, "
                            "info)")
    obs, reward, terminated, truncated, info = out
    if not isinstance(obs, str):
        raise EnvCheckError(f"{where}: observation must be a str, got {type(obs).__name__}")
    if (isinstance(reward, bool) or not isinstance(reward, numbers.Real)
        or not math.isfinite(reward)):
        raise EnvCheckError(f"{where}: reward must be a finite number, got {reward!r}")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise EnvCheckError(f"{where}: terminated and truncated must be bools")
    if terminated and truncated:
        raise EnvCheckError(f"{where}: terminated and truncated are both true; an episode ends one "
                            "way (core.py)")
    if not isinstance(info, dict):
        raise EnvCheckError(f"{where}: info must be a dict")
    action = info.get("action")
    if not isinstance(action, dict) or not isinstance(action.get("kind"), str):
        raise EnvCheckError(f'{where}: info["action"] must be a dict with a "kind" string')
    if not isinstance(info.get("invalid"), bool):
        raise EnvCheckError(f'{where}: info["invalid"] must be a bool')
    if "receipt" in info and not isinstance(info["receipt"], ToolReceipt):
        raise EnvCheckError(f'{where}: info["receipt"] must be a taurl.data.trajectory.ToolReceipt')
    for key, typ in (("error", str), ("role", str), ("verifier_version", str),
                     ("reward_components", dict)):
        if key in info and info[key] is not None and not isinstance(info[key], typ):
            raise EnvCheckError(f'{where}: info["{key}"] must be a {typ.__name__}, got '
                                f'{type(info[key]).__name__}')
    if (terminated or truncated) and not info.get("stop_reason"):
        raise EnvCheckError(f'{where}: a finished episode must say why in info["stop_reason"]')
    if terminated or truncated:
        check_stop_reason(info["stop_reason"], terminated, where)
    return obs, float(reward), terminated, truncated, info.get("stop_reason")


def _episode(env: Env, task: Task, seed: int, actions: Sequence[str],
             max_steps: int) -> list[tuple]:
    out = env.reset(task, seed)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str)
            and isinstance(out[1], dict)):
        raise EnvCheckError(f"{env.name}: reset must return (observation: str, info: dict), got "
                            f"{out!r:.200}")
    check_provenance(out[1], f"{env.name}: reset")
    record: list[tuple] = [(out[0], 0.0, False, False, out[1].get("provenance"))]
    for i in range(max_steps):
        step = _check_step(env.name, env.step(actions[min(i, len(actions) - 1)]), i)
        record.append(step)
        if step[2] or step[3]:
            break
    else:
        raise EnvCheckError(f"{env.name}: the episode did not end within {max_steps} steps; give "
                            "the env a turn budget")
    try:
        env.step(actions[-1])
    except ResetNeeded:
        return record
    raise EnvCheckError(f"{env.name}: step after the episode ended must raise "
                        "taurl.errors.ResetNeeded")


def check_env(env: Env, task: Task, actions: Sequence[str] | None = None, seed: int = 0,
              max_steps: int = 100) -> None:
    """Raise EnvCheckError at the first broken rule (module docstring); `env` must be fresh.

    `actions` are played in order, the last one repeated until the episode ends.
    """
    actions = tuple(DEFAULT_ACTIONS if actions is None else actions)
    if not actions or not all(isinstance(a, str) for a in actions):
        raise EnvCheckError("check_env needs at least one action string")
    _check_attributes(env)
    try:
        env.step(actions[0])
    except ResetNeeded:
        pass
    except Exception as e:
        raise EnvCheckError(f"{env.name}: step before reset raised {type(e).__name__}: {e}; raise "
                            "taurl.errors.ResetNeeded") from e
    else:
        raise EnvCheckError(f"{env.name}: step before reset must raise taurl.errors.ResetNeeded "
                            "(pass a fresh env)")
    first = _episode(env, task, seed, actions, max_steps)
    second = _episode(env, task, seed, actions, max_steps)
    if first != second:
        at = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
                  min(len(first), len(second)))
        raise EnvCheckError(f"{env.name}: the same seed and actions gave different results at step "
                            f"{at} (step 0 is reset; episodes of {len(first)} and {len(second)} "
                            "steps); seed every source of randomness in reset")
