"""Where the RL rollouts run (the config's ``backend``): ``local`` (this process) or ``ray``
(rollout workers on a local Ray cluster, `taurl.scale.ray_backend`). This module imports
no Ray: a config is validated without it."""

from __future__ import annotations

import difflib
import importlib.util
from typing import Any

BACKENDS = ("local", "ray")
# backend_options of ``ray``: name -> (smallest value, what it is)
RAY_OPTIONS = {
    "workers": (1, "rollout workers (Ray actors), each with its own env and LocalEngine"),
    "num_cpus": (1, "CPUs of the local Ray cluster (default: workers)"),
    "max_restarts": (0, "restarts of a worker that dies (its unfinished episodes are re-run)"),
    "max_attempts": (1, "times one episode is tried before it is counted as failed"),
    "engines": (1, "engine: vllm: engine actors, each owning a vLLM server (at most workers)"),
}
# backend_options of ``ray`` with engine: vllm that are not integers: name -> (allowed, what)
ENGINE_OPTIONS: dict[str, tuple[Any, str]] = {
    "engine_cpus": (float, "CPUs of each engine's placement-group bundle (default 1)"),
    "engine_gpus": (float, "GPUs of each engine's bundle (default 0; 1 per engine on a GPU node)"),
    "engine_resource": (str, "a custom resource of the engine nodes (default 'engine', used "
                             "when the cluster has it)"),
    "weight_sync": (("object_store", "shared_fs"), "how a new version reaches the engines"),
    "colocate": (bool, "engines on the learner's node, asleep while it learns"),
    "sleep_level": ((1, 2), "vLLM's sleep level when colocated (default 1)"),
}
# and one mapping: each worker's custom Ray resources, e.g. {engines: 1} (the nodes that have it)
RESOURCES_OPTION = "resources"


def backend_problems(backend: str, options: dict[str, Any], *, engine: str,
                     engine_options: dict[str, Any] | None = None) -> list[str]:
    """What is wrong with `backend` and its `options` (empty when nothing)."""
    if backend not in BACKENDS:
        close = difflib.get_close_matches(str(backend), BACKENDS, n=1)
        return [f"backend must be local or ray (got {backend!r})" + (f"; did you mean {close[0]!r}?"
                                                                     if close else "")]
    if backend == "local":
        return ([f"backend_options {sorted(options)} are for backend: ray; drop them"] if options
                else [])
    out = []
    if importlib.util.find_spec("ray") is None:
        out.append("backend: ray needs the ray package: pip install 'taurl[ray]'")
    out += engine_problems(options, engine=engine, engine_options=engine_options or {})
    for key, value in options.items():
        if key in ENGINE_OPTIONS:
            continue
        if key == RESOURCES_OPTION:
            if not isinstance(value, dict) or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                    for v in value.values()):
                out.append(f"backend_options resources must map Ray resource names to amounts > 0, "
                           f"e.g. {{engines: 1}} (got {value!r})")
        elif key not in RAY_OPTIONS:
            names = [*RAY_OPTIONS, *ENGINE_OPTIONS, RESOURCES_OPTION]
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (it takes {', '.join(names)})"
            out.append(f"unknown backend_options key {key!r} of backend ray{hint}")
        elif not isinstance(value, int) or isinstance(value, bool) or value < RAY_OPTIONS[key][0]:
            out.append(f"backend_options {key} must be an integer >= {RAY_OPTIONS[key][0]} (got "
                       f"{value!r})")
    return out


def engine_problems(options: dict[str, Any], *, engine: str,
                    engine_options: dict[str, Any]) -> list[str]:
    """What is wrong with the engine actors' options of ``backend: ray`` (engine: vllm runs
    in engine actors, `taurl.scale.engine_fleet`; engine: local in each rollout worker)."""
    mine = [k for k in options if k in ENGINE_OPTIONS or k == "engines"]
    if engine == "local":
        return [f"backend_options {mine} are for engine: vllm (engine actors); engine: local "
                "runs in each rollout worker"] if mine else []
    out = []
    if "url" in engine_options:
        out.append("backend: ray starts the vLLM servers in its engine actors; drop engine_options "
                   "url (give python and server_options as for a server taurl starts)")
    if options.get("engines", 1) > options.get("workers", 2):
        out.append(f"backend_options engines ({options.get('engines')}) must be <= workers "
                   f"({options.get('workers', 2)}): each rollout worker samples from one engine")
    for key in mine:
        kind, value = ENGINE_OPTIONS.get(key, (None, None))[0], options[key]
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            ok = ok and (key != "engine_cpus" or value > 0)
        elif kind is bool or kind is str:
            ok = isinstance(value, kind)
        else:
            ok = kind is None or value in kind
        if not ok:
            out.append(f"backend_options {key} {value!r} is not valid: {ENGINE_OPTIONS[key][1]}"
                       + (f" (one of {list(kind)})" if isinstance(kind, tuple) else ""))
    return out
