"""`check_env`: does an environment keep the Env protocol? (after Gymnasium's env_checker)

Checks, in order, each failure an `EnvCheckError` that says what to fix:

1. declared attributes: ``name`` is ``family-vN``, ``version`` non-empty,
   ``observation_style`` is "inline" or "messages" (inline envs declare `stop` strings),
   ``system_prompt`` is a string, every tool is an OpenAI-format JSON-Schema function;
2. `step` before `reset` raises `ResetNeeded` (pass a fresh env);
3. `reset` returns ``(str, dict)``;
4. every `step` returns ``(str, real, bool, bool, dict)``, never terminated and
   truncated at once, with ``info["action"]["kind"]`` and ``info["invalid"]`` (bool),
   and a `ToolReceipt` when ``info["receipt"]`` is present;
5. the episode ends (repeating the last action) within `max_steps`, and then `step`
   raises `ResetNeeded`;
6. the same seed and actions give the same observations, rewards and flags.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from taurl.envs.core import Env, Task
from taurl.errors import EnvCheckError, ResetNeeded
from taurl.trajectory import ToolReceipt

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*-v\d+$")
DEFAULT_ACTIONS = ("", "hello", "<answer>unknown</answer>")


def check_tool(tool: Any, where: str = "tool") -> None:
    """Raise EnvCheckError unless `tool` is {"type": "function", "function": {"name",
    "description", "parameters": {"type": "object", ...}}} with well-formed properties."""
    fix = 'declare tools as {"type": "function", "function": {"name", "description", "parameters": {"type": "object", "properties": {...}}}}'
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise EnvCheckError(f"{where} is not a function declaration; {fix}")
    fn = tool["function"]
    if not isinstance(fn.get("name"), str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", fn["name"]):
        raise EnvCheckError(f"{where}: name must be 1-64 letters, digits, '_' or '-', got {fn.get('name')!r}")
    where = f"tool {fn['name']!r}"
    if not isinstance(fn.get("description"), str) or not fn["description"].strip():
        raise EnvCheckError(f"{where} has no description; the model reads it to decide when to call the tool")
    params = fn.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        raise EnvCheckError(f'{where}: parameters must be a JSON Schema with "type": "object"; {fix}')
    props = params.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(v, dict) and "type" in v for v in props.values()):
        raise EnvCheckError(f'{where}: "properties" must map each argument name to a schema with a "type"')
    required = params.get("required", [])
    if not isinstance(required, list) or any(r not in props for r in required):
        raise EnvCheckError(f'{where}: "required" must list argument names declared in "properties", got {required!r}')


def _check_attributes(env: Env) -> None:
    name = getattr(env, "name", None)
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise EnvCheckError(f"env name {name!r} must look like 'family-vN' (e.g. 'search-v0')")
    if not isinstance(getattr(env, "version", None), str) or not env.version:
        raise EnvCheckError(f"{name}: version must be a non-empty string; bump it when rewards or observations change meaning")
    if getattr(env, "observation_style", None) not in ("inline", "messages"):
        raise EnvCheckError(f"{name}: observation_style must be 'inline' or 'messages', got {getattr(env, 'observation_style', None)!r}")
    stop = getattr(env, "stop", None)
    if not isinstance(stop, tuple) or not all(isinstance(s, str) and s for s in stop):
        raise EnvCheckError(f"{name}: stop must be a tuple of non-empty strings, got {stop!r}")
    if env.observation_style == "inline" and not stop:
        raise EnvCheckError(f"{name}: an inline env must declare the stop strings that end an action")
    if not isinstance(getattr(env, "system_prompt", None), str):
        raise EnvCheckError(f"{name}: system_prompt must be a string")
    tools = getattr(env, "tools", None)
    if not isinstance(tools, list):
        raise EnvCheckError(f"{name}: tools must be a list of JSON-Schema function declarations")
    for i, tool in enumerate(tools):
        check_tool(tool, f"{name}: tool {i}")


def _check_step(name: str, out: Any, i: int) -> tuple[str, float, bool, bool]:
    where = f"{name}: step {i}"
    if not isinstance(out, tuple) or len(out) != 5:
        raise EnvCheckError(f"{where} must return (observation, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, info = out
    if not isinstance(obs, str):
        raise EnvCheckError(f"{where}: observation must be a str, got {type(obs).__name__}")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise EnvCheckError(f"{where}: reward must be a finite number, got {reward!r}")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise EnvCheckError(f"{where}: terminated and truncated must be bools")
    if terminated and truncated:
        raise EnvCheckError(f"{where}: terminated and truncated are both true; an episode ends one way (core.py)")
    if not isinstance(info, dict):
        raise EnvCheckError(f"{where}: info must be a dict")
    action = info.get("action")
    if not isinstance(action, dict) or not isinstance(action.get("kind"), str):
        raise EnvCheckError(f'{where}: info["action"] must be a dict with a "kind" string')
    if not isinstance(info.get("invalid"), bool):
        raise EnvCheckError(f'{where}: info["invalid"] must be a bool')
    if "receipt" in info and not isinstance(info["receipt"], ToolReceipt):
        raise EnvCheckError(f'{where}: info["receipt"] must be a taurl.trajectory.ToolReceipt')
    if (terminated or truncated) and not info.get("stop_reason"):
        raise EnvCheckError(f'{where}: a finished episode must say why in info["stop_reason"]')
    return obs, float(reward), terminated, truncated


def _episode(env: Env, task: Task, seed: int, actions: Sequence[str], max_steps: int) -> list[tuple[str, float, bool, bool]]:
    out = env.reset(task, seed)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str) and isinstance(out[1], dict)):
        raise EnvCheckError(f"{env.name}: reset must return (observation: str, info: dict), got {out!r:.200}")
    record = [(out[0], 0.0, False, False)]
    for i in range(max_steps):
        step = _check_step(env.name, env.step(actions[min(i, len(actions) - 1)]), i)
        record.append(step)
        if step[2] or step[3]:
            break
    else:
        raise EnvCheckError(f"{env.name}: the episode did not end within {max_steps} steps; give the env a turn budget")
    try:
        env.step(actions[-1])
    except ResetNeeded:
        return record
    raise EnvCheckError(f"{env.name}: step after the episode ended must raise taurl.errors.ResetNeeded")


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
        raise EnvCheckError(f"{env.name}: step before reset raised {type(e).__name__}: {e}; raise taurl.errors.ResetNeeded") from e
    else:
        raise EnvCheckError(f"{env.name}: step before reset must raise taurl.errors.ResetNeeded (pass a fresh env)")
    first = _episode(env, task, seed, actions, max_steps)
    second = _episode(env, task, seed, actions, max_steps)
    if first != second:
        at = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
                  min(len(first), len(second)))
        raise EnvCheckError(f"{env.name}: the same seed and actions gave different results at step {at} "
                            f"(step 0 is reset; episodes of {len(first)} and {len(second)} steps); "
                            "seed every source of randomness in reset")
