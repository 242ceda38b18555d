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
}
# and one mapping: each worker's custom Ray resources, e.g. {engines: 1} (the nodes that have it)
RESOURCES_OPTION = "resources"


def backend_problems(backend: str, options: dict[str, Any], *, engine: str) -> list[str]:
    """What is wrong with `backend` and its `options` (empty when nothing)."""
    if backend not in BACKENDS:
        close = difflib.get_close_matches(str(backend), BACKENDS, n=1)
        return [f"backend must be local or ray (got {backend!r})" + (f"; did you mean {close[0]!r}?" if close else "")]
    if backend == "local":
        return [f"backend_options {sorted(options)} are for backend: ray; drop them"] if options else []
    out = []
    if importlib.util.find_spec("ray") is None:
        out.append("backend: ray needs the ray package: pip install 'taurl[ray]'")
    if engine != "local":
        out.append(f"backend: ray runs a LocalEngine in each rollout worker; engine: {engine} on Ray is not "
                   "supported yet (use engine: local, or backend: local with engine: vllm)")
    for key, value in options.items():
        if key == RESOURCES_OPTION:
            if not isinstance(value, dict) or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                    for v in value.values()):
                out.append(f"backend_options resources must map Ray resource names to amounts > 0, "
                           f"e.g. {{engines: 1}} (got {value!r})")
        elif key not in RAY_OPTIONS:
            close = difflib.get_close_matches(key, RAY_OPTIONS, n=1)
            out.append(f"unknown backend_options key {key!r} of backend ray"
                       + (f"; did you mean {close[0]!r}?" if close else f" (it takes {', '.join(RAY_OPTIONS)})"))
        elif not isinstance(value, int) or isinstance(value, bool) or value < RAY_OPTIONS[key][0]:
            out.append(f"backend_options {key} must be an integer >= {RAY_OPTIONS[key][0]} (got {value!r})")
    return out
