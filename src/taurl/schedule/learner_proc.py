"""The async schedule's learner, in a process of its own.

Why a process: producers (the agent loops, the env, the ledger) and the engine's worker run
Python between small tensor ops, and so does a learner on a small policy; in one process
they take turns on the GIL, and the learner — the async pipeline's critical path — runs at
a fraction of its speed. In its own process it has a core's worth of interpreter.

The child builds the learner as `taurl.recipe.reinforce` does (weights, optimizer, critic
and RNG states of the newest checkpoint; the same kill point inside every optimizer step),
then per update: receives the batch, updates, writes checkpoint v+1 (whole or not at all,
with the async bookkeeping in its taurl.json), drops the previous optimizer state, and sends
the learn/* metrics back. It dies with its parent (Linux: PR_SET_PDEATHSIG), so an orphan
never writes a checkpoint after the run was killed; if it dies, the parent's next read
fails and the run stops with an error that says to run the command again (it resumes).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Any

from taurl.errors import Error

KEY_ENV = "TAURL_LEARNER_KEY"


class LearnerDied(Error, RuntimeError):
    """The learner process ended in the middle of the run."""


class LearnerProcess:
    """The parent's handle: `await update(...)` → learn/* metrics; `close()`.

    The child is ``python -m taurl.schedule.learner_proc`` (not a multiprocessing spawn,
    which would re-run the caller's ``__main__``), connected back over a Unix socket with a
    random key."""

    def __init__(self, cfg: Any, run_root: Path, version: int, v_sft: int, seed: int, meta: dict[str, Any]):
        key = os.urandom(16)
        self.listener = Listener(family="AF_UNIX", authkey=key)
        env = {**os.environ, KEY_ENV: key.hex(), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "taurl.schedule.learner_proc", self.listener.address],
                                     env=env)
        self.args = (cfg, str(run_root), version, v_sft, seed, meta)
        self.conn: Any = None
        self.connecting: asyncio.Future | None = None  # `start()`: the child builds while producers run

    def start(self) -> None:
        """Connect and build the learner in the background (call inside the running loop)."""
        self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        accept = asyncio.ensure_future(asyncio.to_thread(self.listener.accept))
        while not accept.done():  # a child that dies before it connects must not hang the run
            if self.proc.poll() is not None:
                self.listener.close()
                break
            await asyncio.wait([accept], timeout=0.2)
        try:
            self.conn = await accept
        except OSError:
            raise self._died() from None
        self.conn.send(self.args)
        await asyncio.to_thread(self._recv)  # "ready": the learner is built

    def _died(self) -> LearnerDied:
        code = self.proc.wait(5)
        return LearnerDied(f"the learner process died (exit code {code}); run the same command again: the run "
                           "resumes from its newest checkpoint, stored episodes kept")

    def _recv(self) -> Any:
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            raise self._died() from None
        if kind == "error":
            raise Error(value)
        return value

    async def update(self, update: int, version: int, batch: list[Any], async_groups: dict[str, list[int]]
                     ) -> dict[str, float]:
        """Train `batch` as update `update` and write checkpoint `version` + 1."""
        if self.connecting is None:
            self.start()
        await self.connecting
        self.conn.send((update, version, batch, async_groups))
        return await asyncio.to_thread(self._recv)

    def close(self) -> None:
        if self.connecting is not None:
            self.connecting.cancel()
        if self.conn is None:  # never connected (the run ended first): nothing to finish
            self.proc.kill()
        elif self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.conn.send(None)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the parent's close() ends the child
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _child(conn: Any, cfg: Any, run_root: str, version: int, v_sft: int, seed: int, meta: dict[str, Any]) -> None:
    _die_with_parent()
    import torch

    from taurl import chaos
    from taurl.episodes import episode_seed
    from taurl.policy.model import load_policy
    from taurl.runs import RunDir
    from taurl.schedule.admission import stale_token_keep
    from taurl.train.checkpoint import (
        drop_optimizer_state,
        load_optimizer_state,
        load_trainer_state,
        save_checkpoint,
        seed_rng,
    )
    from taurl.train.learner import Learner

    try:
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        run = RunDir(Path(run_root))
        model, tok = load_policy(run.checkpoint(version))
        reference = load_policy(run.checkpoint(v_sft))[0] if cfg.kl_coef > 0 else None
        learner = Learner(model, cfg.learner_config(), pad_id=tok.pad_token_id, reference=reference)
        load_optimizer_state(run.checkpoint(version), learner.optimizer)
        learner.load_state(run.checkpoint(version))
        if cfg.mask_stale:
            learner.token_keep = stale_token_keep
        if not load_trainer_state(run.checkpoint(version)):
            seed_rng(episode_seed(seed, "rl-rng"))
        chaos.on_optimizer_step(learner.optimizer)
    except Exception as e:  # noqa: BLE001 — sent to the parent, which raises it
        conn.send(("error", f"the learner process could not start: {type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while (msg := conn.recv()) is not None:
        update, v, batch, groups = msg
        try:
            stats = learner.update(batch, version=v)  # its staleness is against the learner's version
            save_checkpoint(run, v + 1, model, tok, learner.optimizer, phase="rl", update=update,
                            write_extra=learner.save_state, async_groups=groups, **meta)
            drop_optimizer_state(run.checkpoint(v))  # a restart needs only the newest
        except Exception as e:  # noqa: BLE001
            conn.send(("error", f"update {update}: {type(e).__name__}: {e}"))
            return
        conn.send(("ok", stats))


if __name__ == "__main__":
    _conn = Client(sys.argv[1], family="AF_UNIX", authkey=bytes.fromhex(os.environ.pop(KEY_ENV)))
    _child(_conn, *_conn.recv())
