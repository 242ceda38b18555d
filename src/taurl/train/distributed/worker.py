"""A learner rank's process: ``python -m taurl.train.distributed.worker``.

Started by taurl's launcher (`taurl.train.distributed.pool`, one process per rank on this
machine) or by yours (``torchrun``, SLURM, one process per GPU on each node): it joins the
process group from the environment (`taurl.train.distributed.group`), connects back to the
learner that drives it (TAURL_DIST_ADDR host:port, TAURL_DIST_KEY its hex key) and serves
its commands until told to stop:

    build   (model, reference, LearnerConfig, pad_id, strategy)  its replica or shard
    update  (trajs, version, credit)     one update on its share; the metrics
    build_sft / sft_step                 the same for SFT (`taurl.train.distributed.sft`)
    weights                              the whole model's weights (rank 0's answer)
    optimizer_state / load_optimizer_state   AdamW's state, whole, in the single-process format

Models travel as ``torch.save`` bytes (a copy per rank). Each answer is ("ok", value) or
("error", traceback). Started by the launcher, the process dies with its parent (Linux), so a
killed run leaves no rank behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Client, Connection
from typing import Any

import torch

from taurl.train.distributed.wire import (
    ADDR_ENV,
    DEVICE_ENV,
    KEY_ENV,
    ORPHAN_ENV,
    WAIT_ENV,
    from_bytes,
    recv,
    send,
    to_bytes,
)


class Rank:
    """The commands of one rank (module docstring)."""

    def __init__(self, place: Any):
        self.place = place
        self.learner: Any = None

    def build(self, model: bytes, reference: bytes | None, config: Any, pad_id: int,
              strategy: str) -> None:
        from taurl.train.distributed.rank import RankLearner

        self.learner = None  # the previous learner's shards are freed first
        dev = self.place.device
        self.learner = RankLearner(from_bytes(model, dev), config, self.place, strategy,
                                   pad_id=pad_id, reference=from_bytes(reference, dev))

    def build_sft(self, model: bytes, strategy: str, options: dict[str, Any]) -> None:
        from taurl.train.distributed.sft import RankSFT

        self.learner = None
        model_ = from_bytes(model, self.place.device)
        self.learner = RankSFT(model_, self.place, strategy, **options)

    def sft_step(self, trajs: list) -> dict[str, float] | None:
        stats = self.learner.step(trajs)
        return stats if self.place.rank == 0 else None

    def update(self, trajs: list, version: int | None, credit: Any) -> dict[str, float] | None:
        stats = self.learner.update(trajs, version=version, credit=credit)
        return stats if self.place.rank == 0 else None

    def weights(self) -> bytes | None:
        from taurl.train.distributed.wrap import full_model_state

        state = full_model_state(self.learner.model)
        if self.place.rank != 0:
            return None
        return to_bytes(state)

    def optimizer_state(self) -> dict[str, Any] | None:
        from taurl.train.distributed.wrap import full_optimizer_state

        state = full_optimizer_state(self.learner.model, self.learner.optimizer)
        return state if self.place.rank == 0 else None

    def peak_memory(self) -> int:
        """The bytes this rank's process has held in GPU tensors at most (0 on CPU): the
        driver cannot read another process's allocator (benchmarks/gpu_check.py asks)."""
        dev = self.place.device
        return int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else 0

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        from taurl.train.distributed.wrap import load_full_optimizer_state

        load_full_optimizer_state(self.learner.model, self.learner.optimizer, state)


def serve(conn: Connection, rank: Rank) -> None:
    """Answer `conn`'s commands until it sends None or closes."""
    while True:
        try:
            msg = recv(conn)
        except (EOFError, OSError):
            return
        if msg is None:
            return
        cmd, args = msg
        try:
            send(conn, ("ok", getattr(rank, cmd)(*args)))
        except Exception:  # noqa: BLE001 — handed to the driver, which raises it
            send(conn, ("error", f"rank {rank.place.rank}: {traceback.format_exc()}"))


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the driver's close() ends it
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def connect(address: str, key: bytes, wait_s: float) -> Connection | None:
    """A connection to the driver at `address` (host:port), retried while none listens (a
    driver starts listening when its phase starts); None after `wait_s` seconds without one."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return Client((host, int(port)), authkey=key)
        except (OSError, EOFError):  # none listens yet, or the last phase's listener closed
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)


def serve_drivers(once: bool) -> None:
    """Join the group from the environment, then serve the driver at TAURL_DIST_ADDR: one
    driver (`once`: taurl's launchers, local or Ray), or every driver that connects in turn
    (the recipe's SFT, then RL) until none has for TAURL_DIST_WAIT_S seconds (default an
    hour). Shared by this process's `main` and a Ray rank actor
    (`taurl.scale.ray_ranks.RankActor`), so both run the same rank."""
    from taurl.train.distributed.group import join, leave

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    place = join(os.environ.get(DEVICE_ENV, "auto"))
    rank, key = Rank(place), bytes.fromhex(os.environ[KEY_ENV])
    wait_s = float(os.environ.get(WAIT_ENV, "3600"))
    while (conn := connect(os.environ[ADDR_ENV], key, wait_s)) is not None:
        send(conn, place.rank)
        try:
            serve(conn, rank)
        finally:
            conn.close()
        if once:
            break
    leave()


def main() -> None:
    """A rank process (module docstring): started by taurl's launcher, one driver and exit,
    dying with its parent; started by yours, every driver in turn (`serve_drivers`)."""
    ours = bool(os.environ.get(ORPHAN_ENV))
    if ours:
        _die_with_parent()
    serve_drivers(once=ours)
    # nothing is left to write: skip the interpreter's finalization of torch (seconds per rank)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
