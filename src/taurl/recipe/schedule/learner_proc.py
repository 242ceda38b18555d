"""The async schedule's learner, in a process of its own.

Why a process: producers (the agent loops, the env, the ledger) and the engine's worker run
Python between small tensor ops, and so does a learner on a small policy; in one process
they take turns on the GIL, and the learner — the async pipeline's critical path — runs at
a fraction of its speed. In its own process it has a core's worth of interpreter.

The child builds the learner as `taurl.recipe.loop.reinforce` does (the same factory,
`taurl.recipe.stages.learner_for`; weights, optimizer, critic and RNG states of the newest
checkpoint; the same kill point inside every optimizer step), then per update: receives the
batch, runs the synchronous loop's step on it (`taurl.recipe.rl_step`: credit, then update),
sends the learn/* metrics back ("learned") and receives the update's metrics row from the
parent (`commit`); a thread of the child
then writes checkpoint v+1 (whole or not at all, with the async bookkeeping and the row in
its taurl.json, so a kill before the parent appends the row loses none:
`taurl.recipe.record.recover_row`), drops the previous optimizer state and says ("saved", v+1),
while the learner already takes the next batch. The next optimizer step
waits for that write, so a checkpoint is the state after its update, bitwise, and a kill
loses at most the update in flight (a critic or step scorer is saved in the foreground).
The parent records an update's metrics row and loads its weights only once it is saved.
The child dies with its parent (Linux: PR_SET_PDEATHSIG), so an orphan never writes a
checkpoint after the run was killed; if it dies, the parent's next read fails and the run
stops with an error that says to run the command again (it resumes).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Any

from taurl.errors import Error

KEY_ENV = "TAURL_LEARNER_KEY"


class LearnerDied(Error, RuntimeError):
    """The learner process ended in the middle of the run."""


class LearnerProcess:
    """The parent's handle: `await update(...)` → learn/* metrics; `close()`.

    The child is ``python -m taurl.recipe.schedule.learner_proc`` (not a multiprocessing spawn,
    which would re-run the caller's ``__main__``), connected back over a Unix socket with a
    random key."""

    def __init__(self) -> None:
        """Spawn the child now: it imports torch and transformers (seconds) and then waits for
        `start`; the recipe spawns it before SFT and the first evaluation so the imports overlap
        them."""
        key = os.urandom(16)
        self.listener = Listener(family="AF_UNIX", authkey=key)
        env = {**os.environ, KEY_ENV: key.hex(),
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "taurl.recipe.schedule.learner_proc",
                                      self.listener.address],
                                     env=env)
        self.args: tuple | None = None  # `start`
        self.closed = False
        self.conn: Any = None
        # `start()`: the child builds while producers run
        self.connecting: asyncio.Future | None = None
        self.reader: asyncio.Future | None = None  # `_read`, from "ready" on
        # `update` calls, oldest first
        self.learned: collections.deque[asyncio.Future] = collections.deque()
        self.saves: dict[int, asyncio.Future] = {}  # version → its checkpoint is written
        self.failure: BaseException | None = None
        self.closing = False  # `close()`: the end of the connection is expected

    def start(self, cfg: Any, run_root: Path, version: int, v_sft: int, seed: int,
              meta: dict[str, Any]) -> None:
        """Connect and build the learner from checkpoint `version` of `run_root`, in the background
        (call inside the running loop; `ready()` waits for it)."""
        self.args = (cfg, str(run_root), version, v_sft, seed, meta)
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
        self.reader = asyncio.ensure_future(self._read())

    def _died(self) -> LearnerDied:
        code = self.proc.wait(5)
        return LearnerDied(f"the learner process died (exit code {code}); run the same command "
                           "again: the run resumes from its newest checkpoint, stored episodes "
                           "kept")

    def _recv(self) -> Any:
        return self._recv_kind()[1]

    async def _read(self) -> None:
        """The one reader of the connection after "ready": "learned" answers the oldest
        `update`, ("saved", v) answers `saved(v)`; an error or a death fails every waiter."""
        while True:
            try:
                kind, value = await asyncio.to_thread(self._recv_kind)
            except BaseException as e:  # noqa: BLE001 — handed to every waiter
                if self.closing:
                    return
                self.failure = e
                for f in [*self.learned, *self.saves.values()]:
                    if not f.done():
                        f.set_exception(e)
                return
            if kind == "learned":
                self.learned.popleft().set_result(value)
            else:
                self._saved_future(value).set_result(None)

    def _recv_kind(self) -> tuple[str, Any]:
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            raise self._died() from None
        if kind == "error":
            raise Error(value)
        return kind, value

    def _saved_future(self, version: int) -> asyncio.Future:
        if version not in self.saves:
            self.saves[version] = asyncio.get_running_loop().create_future()
            if self.failure is not None:
                self.saves[version].set_exception(self.failure)
        return self.saves[version]

    async def update(self, update: int, version: int, batch: list[Any],
                     async_groups: dict[str, list[int]]
                     ) -> dict[str, float]:
        """Train `batch` as update `update`; returns once the weights are updated. Checkpoint
        `version` + 1 is written behind: `await saved(version + 1)`."""
        await self.ready()
        if self.failure is not None:
            raise self.failure
        answer = asyncio.get_running_loop().create_future()
        self.learned.append(answer)
        self.conn.send((update, version, batch, async_groups))
        return await answer

    def commit(self, row: dict[str, Any]) -> None:
        """Hand the metrics row of the update `update` just answered to the learner, which
        writes it into that update's checkpoint (call it once after every `update`)."""
        self.conn.send(row)

    async def ready(self) -> None:
        """Return once the learner is built (its start-up overlaps the first rollouts)."""
        if self.connecting is None:
            raise Error("LearnerProcess.start() was not called")
        await self.connecting

    async def saved(self, version: int) -> None:
        """Return once checkpoint `version` is whole on disk (raises what the learner raised)."""
        await self._saved_future(version)

    def close(self, kill: bool = False) -> None:
        """End the learner process: it finishes what it was sent, or, with `kill` (the run
        stopped with an error), at once (its writes are atomic: a kill leaves no half file)."""
        if self.closed:
            return
        self.closed = self.closing = True
        if self.connecting is not None:
            self.connecting.cancel()
        if self.conn is None or kill:
            # never connected (the run ended first), or an error: nothing to finish
            self.proc.kill()
            if self.conn is None and self.connecting is not None:
                # a thread of `_connect` may wait in accept(): a bare connection, closed at once,
                # makes it return (its handshake fails), so no thread outlives the run
                with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.listener.address)
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
    with contextlib.suppress(OSError, AttributeError):
        # not Linux: the parent's close() ends the child
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class CheckpointWriter:
    """Checkpoints written by a thread of its own while the learner takes its next batch.

    The forward and backward passes change no weight and no optimizer state; what does —
    the next step's learning rate, the step itself — waits in `wait`, which `attach` makes
    the learner's `before_step` (ahead of any optimizer hook, the kill point's included), so
    a checkpoint's files are exactly the state after its update, its optimizer's recorded
    learning rate too, and a kill loses at most the update in flight. background False:
    each write runs at once, in the caller's thread.
    """

    def __init__(self, background: bool = True):
        self._pool = (ThreadPoolExecutor(1, thread_name_prefix="taurl-checkpoint") if background
                      else None)
        self._pending: list[Future] = []  # the checkpoint being written

    def attach(self, learner: Any) -> None:
        learner.before_step.append(self.wait)

    def submit(self, fn: Any, *args: Any) -> None:
        if self._pool is None:
            fn(*args)
        else:
            self._pending.append(self._pool.submit(fn, *args))

    def wait(self) -> None:
        """Until the pending write is on disk; a failed write raises here (in the learner's
        update)."""
        while self._pending:
            self._pending.pop().result()


# Over 60 lines on purpose: the learner process's main: its imports, its state and its command
# loop (update, save, stop) must live in the child's one frame.
def _child(conn: Any, cfg: Any, run_root: str, version: int, v_sft: int, seed: int,
           meta: dict[str, Any]) -> None:
    _die_with_parent()
    import torch

    from taurl import chaos
    from taurl.data.runs import RunDir
    from taurl.policy.model import load_policy
    from taurl.recipe.rl_step import rl_step
    from taurl.recipe.schedule.admission import stale_token_keep
    from taurl.recipe.stages import learner_for
    from taurl.rollout.seeds import episode_seed
    from taurl.train.checkpoint import (
        drop_optimizer_state,
        load_optimizer_state,
        load_trainer_state,
        rng_state,
        save_checkpoint,
        seed_rng,
    )

    try:
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        run = RunDir(Path(run_root))
        from taurl.policy.device import resolve_device
        from taurl.train.precision import master_dtype

        # the run's device; the engine's dtype, or fp32 master weights under mixed precision
        device, dtype = resolve_device(cfg.device), master_dtype(cfg.precision, cfg.torch_dtype)
        if cfg.lora:  # adapters on the SFT policy, as the sync loop builds them; each version's
            # checkpoint holds its adapter, which the engine serves merged (docs/lora.md)
            model, tok, reference, adapter = _lora_policy(cfg, run, version, v_sft)
            model.to(device=device, dtype=dtype)
            meta = {**meta, **adapter}
        else:
            model, tok = load_policy(run.checkpoint(version), device, dtype=dtype)
            reference = (load_policy(run.checkpoint(v_sft), device, dtype=dtype)[0]
                         if cfg.kl_coef > 0 else None)
        learner = learner_for(cfg, run, v_sft, model, tok, reference)  # the sync loop's factory
        load_optimizer_state(run.checkpoint(version), learner.optimizer)
        learner.load_state(run.checkpoint(version))
        if cfg.mask_stale:
            learner.token_keep = stale_token_keep
        if not load_trainer_state(run.checkpoint(version)):
            seed_rng(episode_seed(seed, "rl-rng"))
    except Exception as e:  # noqa: BLE001 — sent to the parent, which raises it
        conn.send(("error", f"the learner process could not start: {type(e).__name__}: {e}"))
        return
    send = _locked(conn.send)  # the writer thread sends too
    send(("ready", None))
    # a critic or a step scorer (their own models and optimizers) is saved in the foreground
    writer = CheckpointWriter(background=(learner.critic is None
                                          and not hasattr(learner.shaper, "save")))
    writer.attach(learner)
    chaos.on_optimizer_step(learner.optimizer)

    def write(update: int, v: int, rng: dict[str, Any], groups: dict[str, list[int]],
              row: dict[str, Any]) -> None:
        try:
            save_checkpoint(run, v + 1, model, tok, learner.optimizer, phase="rl", update=update,
                            write_extra=learner.save_state, rng=rng, async_groups=groups,
                            metrics_row=row, **meta)
            drop_optimizer_state(run.checkpoint(v))  # a restart needs only the newest
        except Exception as e:  # the parent hears of it at once; the next step raises it again
            send(
                ("error", f"update {update}: writing checkpoint v{v + 1}: {type(e).__name__}: {e}")
            )
            raise
        send(("saved", v + 1))

    while (msg := conn.recv()) is not None:
        update, v, batch, groups = msg
        try:
            # the sync loop's step: credit, then update; staleness against the learner's version
            stats = rl_step(learner, batch, v)
            writer.wait()  # (an update that took no optimizer step)
            rng = rng_state()
        except Exception as e:  # noqa: BLE001 — sent to the parent, which raises it
            send(("error", f"update {update}: {type(e).__name__}: {e}"))
            return
        send(("learned", stats))
        # the parent answers with the update's metrics row (milliseconds), which the checkpoint
        # carries; None: the run stops before it recorded this update, which is then not saved
        if (row := conn.recv()) is None:
            break
        try:
            writer.submit(write, update, v, rng, groups, row)
        except Exception as e:  # noqa: BLE001 — sent to the parent, which raises it
            send(("error", f"update {update}: {type(e).__name__}: {e}"))
            return
    try:
        writer.wait()  # the last checkpoint is written before the process ends
    except Exception as e:  # noqa: BLE001
        send(("error", f"writing the last checkpoint: {type(e).__name__}: {e}"))


def _lora_policy(
    cfg: Any, run: Any, version: int, v_sft: int
) -> tuple[Any, Any, None, dict[str, Any]]:
    """(model, tokenizer, reference, checkpoint meta) of a LoRA run's learner at `version`:
    the SFT policy with fresh adapters (or `version`'s), no reference model (the KL reference
    is the base with the adapters off), and the ``lora`` entry every checkpoint carries (its
    base and the base's digest). The adapters' seed is the run's, as in
    `taurl.recipe.loop.reinforce`, so both schedules draw the same A matrices."""
    from taurl.train import lora

    options = lora.LoraOptions.from_dict(cfg.lora)
    model, tok = lora.rl_policy(run, version, v_sft, options, seed=cfg.seed)
    return model, tok, None, {"lora": lora.checkpoint_meta(run, v_sft, options)}


def _locked(fn: Any) -> Any:
    lock = threading.Lock()

    def call(*args: Any) -> Any:
        with lock:
            return fn(*args)

    return call


if __name__ == "__main__":
    _die_with_parent()
    import taurl.recipe.rl_step  # noqa: F401 — torch and transformers, before the parent needs it

    _conn = Client(sys.argv[1], family="AF_UNIX", authkey=bytes.fromhex(os.environ.pop(KEY_ENV)))
    _child(_conn, *_conn.recv())
