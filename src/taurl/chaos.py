"""Named kill points, for the chaos test (`tests/test_chaos.py`, `benchmarks/chaos.py`).

The harness that runs ``taurl`` in a child process for them is `tests/chaos_harness.py`:
library code never imports the CLI.

A kill point is a place where a real crash must be survivable: `point(event, tag)` is
called there. Unless ``$TAURL_CHAOS_KILL_AT`` or ``$TAURL_CHAOS_TRACE`` is set it does
nothing (one dict lookup), so production runs pay nothing.

    TAURL_CHAOS_KILL_AT="learner_step@step=3"   SIGKILL this process at that point
    TAURL_CHAOS_TRACE=/path/trace.txt           append "event@tag" of every point reached

The process kills itself with SIGKILL, which no handler, ``finally`` or atexit sees: the
state left behind is exactly that of a ``kill -9`` (or an out-of-memory kill) there. Tags
name the work (an episode id, a version, an optimizer step), not a count of calls, so
the same point can be named again after a restart has redone part of the work.

The points (event: where):
    episode_stored      an episode was committed to the ledger (rollouts and evaluations)
    rollouts_stored     a round's batch is complete, before the learner runs
    learner_step        inside the learner's update: gradients computed, before AdamW.step
    checkpoint_files    inside the checkpoint save: weights written, optimizer state not yet
    checkpoint_synced   inside the checkpoint save: every file fsynced, before the rename
    checkpoint_saved    between the save and the engine's weight swap
    update_done         after the round's metrics
    sft_step            after an SFT optimizer step
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

KILL_ENV = "TAURL_CHAOS_KILL_AT"
TRACE_ENV = "TAURL_CHAOS_TRACE"
# placed in the code itself (`taurl.rollout.episodes.collect`), not by the hook
OWN_POINTS = {"episode_stored"}
TAG_KEYS = ("episode_id", "version", "step")  # the info keys that name a point's work


def point(event: str, tag: str = "", facts: Callable[[], dict[str, Any]] | None = None) -> None:
    """A kill point (module docstring); `facts()` (digests of the state there) go to the trace."""
    env = os.environ
    if KILL_ENV not in env and TRACE_ENV not in env:
        return
    name = f"{event}@{tag}"
    if trace := env.get(TRACE_ENV):
        line = name + (" " + json.dumps(facts(), sort_keys=True) if facts is not None else "")
        with open(trace, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())  # the trace must survive the kill it records
    if env.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def tag_of(info: dict[str, Any]) -> str:
    """The tag of a recipe hook's `info` (its episode id, version or step)."""
    return ",".join(f"{k}={info[k]}" for k in TAG_KEYS if k in info)


def hooked(hook: Any) -> Any:
    """`hook` (the recipe's event callback) preceded by the kill point of each event."""

    def call(event: str, info: dict[str, Any]) -> None:
        if event not in OWN_POINTS:
            point(event, tag_of(info))
        hook(event, info)

    return call


def on_optimizer_step(optimizer: Any) -> None:
    """Put the ``learner_step`` point inside every `optimizer.step()` (before it changes anything).

    A pre-hook of the optimizer: the learner itself needs no edit. The tag is the number
    of the step about to be taken, restored with the optimizer state after a restart.
    """

    def pre(opt: Any, args: Any, kwargs: Any) -> None:
        point("learner_step", f"step={optimizer_steps(opt) + 1}", lambda: state_digests(opt))

    optimizer.register_step_pre_hook(pre)


def optimizer_steps(optimizer: Any) -> int:
    """Steps taken by an Adam-family optimizer (its per-parameter ``step``), 0 if none."""
    for state in optimizer.state.values():
        if "step" in state:
            return int(state["step"])
    return 0


def digest_tensors(items: Sequence[tuple[str, Any]]) -> str:
    """sha256 of named tensors' bytes, dtypes and shapes (equal digests: bitwise-equal tensors)."""
    h = hashlib.sha256()
    for name, t in items:
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def optimizer_digest(state_dict: dict[str, Any]) -> str:
    """Digest of an optimizer's `state_dict()`: every moment tensor and step, and the
    hyper-parameters."""
    items = []
    for pid in sorted(state_dict["state"]):
        for k, v in sorted(state_dict["state"][pid].items()):
            items.append((f"{pid}.{k}",
                          v if isinstance(v, torch.Tensor) else torch.tensor(float(v))))
    groups = json.dumps([{k: v for k, v in g.items()} for g in state_dict["param_groups"]],
                        sort_keys=True, default=str)
    return digest_tensors(items) + ":" + hashlib.sha256(groups.encode()).hexdigest()[:8]


def rng_digest() -> str:
    """Digest of the global RNG states of python, numpy and torch."""
    np_state = np.random.get_state()
    text = json.dumps([random.getstate(), np_state[0], np_state[1].tolist(), list(np_state[2:])],
                      default=str)
    return hashlib.sha256(text.encode() + torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]


def state_digests(optimizer: Any) -> dict[str, str]:
    """The facts of a learner point: digests of the optimizer state, the parameters and the RNGs."""
    params = [(f"{i}.{j}", p)
              for i, g in enumerate(optimizer.param_groups) for j, p in enumerate(g["params"])]
    return {"optimizer": optimizer_digest(optimizer.state_dict()), "params": digest_tensors(params),
            "rng": rng_digest()}
