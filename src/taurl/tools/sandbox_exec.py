"""Run one prepared command: capped output capture, wall-clock timeout, whole-tree kill.

`execute` is the engine under `Sandbox.run`, and `SandboxLimits` the limits it enforces
(defined here, re-exported by `taurl.tools.sandbox`, so this module needs nothing from
that one). It knows nothing of bwrap options; it gets an argv and, for an isolated run,
a pipe that bwrap's ``--info-fd`` writes the host pid of the pid namespace's init to. Killing that
init makes the kernel kill every process in the namespace (pid_namespaces(7)); bwrap reaps it and
exits only after that, so when `execute` returns the tree is gone.

It drives the child with the event loop's fd readiness directly (a pidfd for the exit,
non-blocking pipe fds for the streams) rather than asyncio's subprocess transports:
those only report the exit once every pipe is closed, so a descendant that keeps a pipe
open would hold `run` hostage; and they start a waiter thread per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from taurl.errors import ConfigError, SandboxError

_KILL_GRACE_S = 5.0  # wait for bwrap to reap a killed namespace before killing bwrap too
_DRAIN_GRACE_S = 1.0  # wait for the pipes to reach EOF once the command has exited


@dataclass(frozen=True)
class SandboxLimits:
    """Per-command limits. Sizes are bytes; times are seconds."""

    timeout_s: float = 10.0  # wall clock; the whole process tree is killed
    cpu_s: int = 10  # RLIMIT_CPU soft limit (SIGXCPU); the hard limit is one second later
    memory_bytes: int = 1 << 30  # RLIMIT_AS (address space, per process)
    nproc: int = 64  # RLIMIT_NPROC: processes + threads in this sandbox
    fsize_bytes: int = 64 << 20  # RLIMIT_FSIZE: largest file a process may write
    nofile: int = 256  # RLIMIT_NOFILE: open file descriptors per process
    tmp_bytes: int = 64 << 20  # size of the /tmp tmpfs (memory)
    shm_bytes: int = 16 << 20  # size of the /dev/shm tmpfs (memory)
    max_output_bytes: int = 64 << 10  # kept per stream; the rest is counted, not stored
    max_drain_bytes: int = 16 << 20  # read per stream before the run is killed

    def __post_init__(self) -> None:
        bad = [f"{k} must be > 0 (got {v!r})" for k, v in vars(self).items() if not v > 0]
        if self.max_drain_bytes < self.max_output_bytes:
            bad.append("max_drain_bytes must be >= max_output_bytes")
        if bad:
            raise ConfigError(bad)


@dataclass(frozen=True)
class ExecResult:
    """What one sandboxed command did.

    exit_code: the command's exit status; 128+N when signal N killed it (the shell's and
        bwrap's convention: 137 = SIGKILL, 152 = SIGXCPU, 153 = SIGXFSZ).
    stdout / stderr: the first `max_output_bytes` of each stream, decoded as UTF-8
        (invalid bytes replaced). `*_bytes` count everything the command wrote.
    timed_out: the wall-clock timeout fired and the tree was killed.
    killed_reason: why the host killed the tree: "timeout", "output_limit" (a stream
        exceeded `max_drain_bytes`) or None. Kills by rlimits show in `exit_signal`.
    wall_s: seconds from spawn to reap, sandbox setup included.
    isolated: False only under `unsafe_no_isolation`.
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None
    truncated_stdout: bool
    truncated_stderr: bool
    wall_s: float
    stdout_bytes: int
    stderr_bytes: int
    isolated: bool

    @property
    def exit_signal(self) -> int | None:
        """The signal that ended the command, if its status says one did (128+N)."""
        return self.exit_code - 128 if 128 < self.exit_code < 128 + 65 else None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_reason is None


@dataclass(frozen=True)
class Plan:
    """A command ready to spawn."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    info_pipe: tuple[int, int] | None  # bwrap --info-fd (read end, write end)
    preexec: Callable[[], None] | None  # unsafe mode only: set rlimits in the child


def rlimit_args(lim: SandboxLimits) -> list[tuple[str, tuple[int, int]]]:
    """(prlimit(1) name, (soft, hard)). CPU: SIGXCPU at the soft limit, SIGKILL 1 s later."""
    return [
        ("cpu", (lim.cpu_s, lim.cpu_s + 1)),
        ("as", (lim.memory_bytes,) * 2),
        ("nproc", (lim.nproc,) * 2),
        ("fsize", (lim.fsize_bytes,) * 2),
        ("nofile", (lim.nofile,) * 2),
        ("core", (0, 0)),
    ]


def rlimit_preexec(lim: SandboxLimits) -> Callable[[], None]:
    """rlimits for unsafe (non-isolated) runs, set in the forked child before exec.

    Without a user namespace RLIMIT_NPROC counts every process of this uid on the host,
    and the kernel does not enforce it at all for root.
    """
    pairs = [(getattr(resource, f"RLIMIT_{name.upper()}"), v) for name, v in rlimit_args(lim)]

    def apply() -> None:
        for res, value in pairs:
            resource.setrlimit(res, value)

    return apply


class _Capture:
    """Keeps the first `keep` bytes of a stream and counts the rest."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.buf = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep - len(self.buf)
        if room > 0:
            self.buf += chunk[:room]

    def text(self) -> str:
        return self.buf.decode("utf-8", errors="replace")


def _parent_pid(pid: int) -> int | None:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])  # field 4, after "(comm) state"


class _Run:
    """One spawned command: its pipes, its exit, and how to kill its whole tree."""

    def __init__(self, plan: Plan, stdin: bytes | None, lim: SandboxLimits) -> None:
        self.loop = asyncio.get_running_loop()
        child_fds = (plan.info_pipe[1],) if plan.info_pipe else ()
        self.proc = subprocess.Popen(
            plan.argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=plan.env,
            cwd=plan.cwd,
            pass_fds=child_fds,
            start_new_session=True,  # its own process group: the unsafe-mode kill target
            preexec_fn=plan.preexec,  # None when isolated, so CPython can use vfork
        )
        self.drain = lim.max_drain_bytes
        self.out, self.err = _Capture(lim.max_output_bytes), _Capture(lim.max_output_bytes)
        self.flood = self.loop.create_future()
        self.exited = self.loop.create_future()
        self.eof: list[asyncio.Future] = []
        self.watched: list[tuple[int, bool]] = []  # (fd, is_writer) registered with the loop
        self.isolated = plan.info_pipe is not None
        self.info_r = plan.info_pipe[0] if plan.info_pipe else None
        self.info = b""
        self.init_pidfd: int | None = None
        self.pidfd = os.pidfd_open(self.proc.pid)
        self._watch(self.pidfd, self._on_exit)
        for pipe, cap in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            self._stream(pipe.fileno(), cap)
        if stdin is not None:
            self._feed(self.proc.stdin.fileno(), memoryview(stdin))
        if self.info_r is not None:
            os.set_blocking(self.info_r, False)
            self._watch(self.info_r, self._read_info)

    # -- event-loop plumbing --------------------------------------------------------

    def _watch(self, fd: int, cb, *args, writer: bool = False) -> None:
        (self.loop.add_writer if writer else self.loop.add_reader)(fd, cb, *args)
        self.watched.append((fd, writer))

    def _unwatch(self, fd: int, writer: bool = False) -> None:
        if (fd, writer) in self.watched:
            (self.loop.remove_writer if writer else self.loop.remove_reader)(fd)
            self.watched.remove((fd, writer))

    def _on_exit(self) -> None:
        self._unwatch(self.pidfd)
        if not self.isolated:
            # Unsafe mode: kill leftovers in the group (setsid escapes this) while the
            # unreaped leader still pins the group id, so it cannot name anyone else's.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.poll()  # reap it: the pidfd says it has exited
        if not self.exited.done():
            self.exited.set_result(None)

    def _stream(self, fd: int, cap: _Capture) -> None:
        os.set_blocking(fd, False)
        done = self.loop.create_future()
        self.eof.append(done)

        def on_readable() -> None:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            if chunk:
                cap.add(chunk)
                if cap.total > self.drain and not self.flood.done():
                    self.flood.set_result(None)  # keep reading so the writer never blocks
                return
            self._unwatch(fd)
            done.set_result(None)

        self._watch(fd, on_readable)

    def _feed(self, fd: int, data: memoryview) -> None:
        os.set_blocking(fd, False)
        pos = 0

        def on_writable() -> None:
            nonlocal pos
            try:
                pos += os.write(fd, data[pos : pos + (1 << 16)])
            except BlockingIOError:
                return
            except OSError:  # the command closed its stdin (EPIPE): it did not want more
                pos = len(data)
            if pos >= len(data):
                self._unwatch(fd, writer=True)
                self.proc.stdin.close()

        self._watch(fd, on_writable, writer=True)

    def _read_info(self) -> None:
        # Open a pidfd on init as soon as bwrap names it: a pidfd cannot go to a reused pid.
        try:
            chunk = os.read(self.info_r, 4096)
        except BlockingIOError:
            return
        self.info += chunk
        if chunk and b"}" not in self.info:
            return
        self._close_info()
        with contextlib.suppress(ValueError, OSError, KeyError, TypeError):
            pid = int(json.loads(self.info)["child-pid"])
            pidfd = os.pidfd_open(pid)
            # Only ever signal bwrap's own child (defence in depth: the info is bwrap's).
            if _parent_pid(pid) == self.proc.pid:
                self.init_pidfd = pidfd
            else:
                os.close(pidfd)

    def _close_info(self) -> None:
        if self.info_r is not None:
            self._unwatch(self.info_r)
            os.close(self.info_r)
            self.info_r = None

    # -- killing --------------------------------------------------------------------

    def signal_kill(self) -> None:
        """SIGKILL everything now: the namespace's init, or (unsafe) the process group."""
        if self.info_r is not None:
            self._read_info()  # bwrap may have written it since the loop last looked
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.init_pidfd is not None:
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            elif self.proc.returncode is None:  # unreaped: the group id is still ours
                # Unsafe mode, or bwrap has not named init yet: kill the process group. For
                # bwrap the kernel then SIGKILLs its child (--die-with-parent).
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def kill(self) -> None:
        self.signal_kill()
        await asyncio.wait([self.exited], timeout=_KILL_GRACE_S)
        if not self.exited.done():  # bwrap did not reap its namespace: kill bwrap itself
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            await asyncio.wait([self.exited], timeout=_KILL_GRACE_S)

    def close(self) -> None:
        for fd, writer in list(self.watched):
            self._unwatch(fd, writer)
        self._close_info()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        for fd in (self.pidfd, self.init_pidfd):
            if fd is not None:
                os.close(fd)
        self.init_pidfd = None


async def execute(
    plan: Plan, stdin: bytes | None, lim: SandboxLimits, timeout_s: float
) -> ExecResult:
    """Spawn `plan`, capture its output, enforce the deadline, and reap the whole tree."""
    t0 = time.monotonic()
    try:
        run = _Run(plan, stdin, lim)
    except OSError as e:
        if plan.info_pipe is not None:
            os.close(plan.info_pipe[0])
        raise SandboxError(f"cannot start {plan.argv[0]!r}: {e}") from None
    finally:
        if plan.info_pipe is not None:
            os.close(plan.info_pipe[1])
    killed_reason = None
    try:
        await asyncio.wait(
            [run.exited, run.flood], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if not run.exited.done():
            killed_reason = "output_limit" if run.flood.done() else "timeout"
            await run.kill()
        # Isolated: the namespace is gone, so the pipes are at EOF. Unsafe: an escaped
        # descendant may hold them open; stop waiting after a grace period.
        await asyncio.wait(run.eof, timeout=_DRAIN_GRACE_S)
    finally:
        if not run.exited.done():  # cancelled, or unkillable: never leave the tree running
            run.signal_kill()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([run.exited], timeout=_KILL_GRACE_S)
        run.close()
    rc = run.proc.returncode
    return ExecResult(
        exit_code=137 if rc is None else (128 - rc if rc < 0 else rc),
        stdout=run.out.text(),
        stderr=run.err.text(),
        timed_out=killed_reason == "timeout",
        killed_reason=killed_reason,
        truncated_stdout=run.out.total > len(run.out.buf),
        truncated_stderr=run.err.total > len(run.err.buf),
        wall_s=time.monotonic() - t0,
        stdout_bytes=run.out.total,
        stderr_bytes=run.err.total,
        isolated=plan.info_pipe is not None,
    )
