"""The ranks' launcher and channel: local processes on this machine, or ranks you start.

`RankPool.start(N)` runs N processes ``python -m taurl.train.distributed.worker`` with the
environment torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1,
MASTER_PORT a free port), so they form a gloo (CPU) or nccl (CUDA) group on loopback.
`RankPool.listen(address, N, key)` starts none: it waits for N ranks you launched
(torchrun, SLURM) with TAURL_DIST_ADDR=address and TAURL_DIST_KEY=key.hex() in their
environment. Either way each rank connects back here (an authenticated
`multiprocessing.connection`), and `call(command, ...)` sends one command to every rank and
returns their answers in rank order. A rank's error is raised here with its traceback, and
one that dies ends the call, so the driver never waits on a rank that is gone.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection, Listener, wait
from typing import Any

import torch

from taurl.errors import Error
from taurl.train.distributed.group import free_port
from taurl.train.distributed.wire import ADDR_ENV, DEVICE_ENV, KEY_ENV, ORPHAN_ENV, recv, send

LAUNCH_ENV = "TAURL_DIST_LAUNCH"  # "external": the driver waits for your ranks at TAURL_DIST_ADDR
START_TIMEOUT_S = 600.0  # ranks import torch and join the group: minutes on a loaded machine


class RankDied(Error, RuntimeError):
    """A learner rank ended, or failed, in the middle of a command."""


class RankPool:
    """The connections to the ranks (rank order) and, when started here, their processes."""

    def __init__(self, conns: list[Connection], procs: list[subprocess.Popen], listener: Listener):
        self.conns, self.procs, self.listener = conns, procs, listener
        self.world_size = len(conns)

    @classmethod
    def start(cls, world_size: int, device: str = "cpu") -> RankPool:
        """`world_size` local rank processes (module docstring) on `device` (cpu | cuda | auto)."""
        key = os.urandom(16)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        env = {**os.environ, "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(free_port()), ADDR_ENV: f"127.0.0.1:{listener.address[1]}",
               KEY_ENV: key.hex(), DEVICE_ENV: device, ORPHAN_ENV: "1",
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        procs = [subprocess.Popen([sys.executable, "-m", "taurl.train.distributed.worker"],
                                  env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
                 for r in range(world_size)]
        return cls(_accept(listener, world_size, procs), procs, listener)

    @classmethod
    def listen(cls, address: tuple[str, int], world_size: int, key: bytes) -> RankPool:
        """Wait for `world_size` ranks started elsewhere (module docstring)."""
        listener = Listener(address, authkey=key)
        return cls(_accept(listener, world_size, []), [], listener)

    def call(self, command: str, *args: Any) -> list[Any]:
        """`command(*args)` on every rank; their answers in rank order."""
        for c in self.conns:
            send(c, (command, args))
        answers: dict[int, Any] = {}
        pending = dict(enumerate(self.conns))
        while pending:
            for conn in wait(list(pending.values()), timeout=1.0):
                rank = self.conns.index(conn)
                try:
                    kind, value = recv(conn)
                except (EOFError, OSError):
                    raise self._failed(f"learner rank {rank} died during {command!r}") from None
                if kind == "error":
                    raise self._failed(value)
                answers[rank] = value
                del pending[rank]
            dead = [r for r, p in enumerate(self.procs) if r in pending and p.poll() is not None]
            if dead:
                raise self._failed(f"learner rank {dead[0]} died during {command!r}")
        return [answers[r] for r in range(self.world_size)]

    def pull_weights(self, model: torch.nn.Module) -> None:
        """Load the ranks' whole weights (gathered on rank 0) into `model`."""
        data = self.call("weights")[0]
        model.load_state_dict(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))

    def _failed(self, why: str) -> RankDied:
        self.close(kill=True)  # the other ranks may wait in a collective for the lost one
        return RankDied(why)

    def close(self, kill: bool = False) -> None:
        """Stop the ranks: they finish their command, or, with `kill`, at once."""
        for c in self.conns:
            if not kill:
                with contextlib.suppress(OSError):
                    send(c, None)
            c.close()
        self.conns = []
        for p in self.procs:
            if kill:
                p.kill()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        self.listener.close()


def start_ranks(world_size: int, device: str = "cpu") -> RankPool:
    """The ranks of a driver: started here, or, with TAURL_DIST_LAUNCH=external, yours (torchrun)
    connecting to TAURL_DIST_ADDR with TAURL_DIST_KEY (the same two variables in both places)."""
    if os.environ.get(LAUNCH_ENV) != "external":
        return RankPool.start(world_size, device)
    host, port = os.environ[ADDR_ENV].rsplit(":", 1)
    return RankPool.listen((host, int(port)), world_size, bytes.fromhex(os.environ[KEY_ENV]))


def _accept(listener: Listener, world_size: int, procs: list[subprocess.Popen]) -> list[Connection]:
    """The ranks' connections in rank order (each says its rank first); a started process that
    dies before it connects ends the wait with an error."""
    conns: dict[int, Connection] = {}
    deadline = time.monotonic() + START_TIMEOUT_S
    with ThreadPoolExecutor(1) as ex:
        while len(conns) < world_size:
            accepting = ex.submit(listener.accept)
            while not accepting.done():
                if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                    for p in procs:
                        p.kill()
                    _wake(listener)
                    listener.close()
                    raise RankDied("a learner rank ended before it joined (its log is above)")
                time.sleep(0.1)
            try:
                conn = accepting.result()
                conns[int(recv(conn))] = conn
            except (OSError, EOFError):  # a connection dropped in its handshake: wait for the next
                continue
    return [conns[r] for r in range(world_size)]


def _wake(listener: Listener) -> None:
    """Return a thread blocked in `listener.accept()`: a bare connection, closed at once, fails
    its handshake (closing the listener alone does not wake it)."""
    with contextlib.suppress(OSError), socket.create_connection(listener.address, timeout=1.0):
        pass
