"""A warm Python executor: one long-lived python3 "zygote" inside a sandbox per episode.

    async with WarmPython.start(sandbox) as wp:        # or WarmPython.start(config=…)
        r = await wp.run_code("print(6 * 7)", timeout_s=5)
        r.exit_code, r.stdout                         # 0, "42\\n"
        await wp.run_argv(["python3", "main.py"])      # the argv path may exec anything

Why: `Sandbox.run` pays bwrap + setpriv + prlimit (~10-12 ms) and Python's start-up
(~12 ms) on every command. Here both are paid once: the zygote
(`taurl.tools.zygote_server`, stdlib only, passed with ``python3 -c``) starts under the
very same bwrap isolation as `Sandbox.run` (same namespaces, read-only system, private
workspace, clean environment, rlimits via prlimit) and serves each request in a fresh
``os.fork()`` child, so a request costs a fork, not a process start.

What a request gets (enforced inside the sandbox by the zygote, see its docstring):
* a fresh fork: no Python state from earlier requests; only workspace files persist
  (/tmp and /dev/shm are emptied after every request);
* rlimits set in the child: CPU, address space, file size and open files exactly as
  `SandboxLimits` says. RLIMIT_NPROC counts per (user namespace, uid), i.e. the whole
  sandbox (see `taurl.tools.sandbox`): a one-shot run shares it with bwrap's init, a
  zygote request with init and the zygote, so the limit is set one higher (`nproc + 1`)
  to give a request the same number of processes as `Sandbox.run` gives a command.
  Requests are served one at a time per zygote, so nothing else competes for it.
* a wall-clock timeout, and an output cap (`max_drain_bytes`): the zygote SIGKILLs every
  other process in the sandbox's pid namespace (``kill(-1)``, which setsid cannot escape)
  and answers only once /proc lists nobody but init and itself: nothing a request
  started outlives it, whether the request ended by itself, by timeout or by flood.
* the zygote's own CPU limit is `_ZYGOTE_CPU_S` (its time accumulates over an episode);
  each child lowers it to `cpu_s`.

Fail closed: the host treats the zygote as untrusted. If it dies, breaks the protocol
(bad frame, wrong id, oversized answer), answers late (timeout + `_HOST_GRACE_S`) or
reports that it could not clean up, the host SIGKILLs the sandbox's pid namespace init
(the kernel then kills everything in it), reports the request as lost
(``killed_reason="sandbox_lost"``, exit code 137) and starts a new zygote. The zygote is
non-dumpable, so a request (same uid) cannot ptrace it or open its /proc fds and mem.

Both paths return the `ExecResult` of `Sandbox.run` (same exit-code conventions, caps and
killed_reason values, plus "sandbox_lost"); `wall_s` excludes the zygote's start.
Where `run_code` differs from ``python3 -c``: ``sys.flags`` show ``-I -B -u``, and
``sys.modules`` already holds what the zygote imported (json, selectors, ctypes, …).
Not reset between requests: System V IPC objects and POSIX message queues (the IPC
namespace lives as long as the zygote's sandbox); a new zygote per episode bounds that.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from importlib import resources
from typing import Any

from taurl.errors import SandboxError
from taurl.tools.sandbox import _SYSTEM_PATH, WORKSPACE, Sandbox, SandboxConfig, _env_problems
from taurl.tools.sandbox_exec import ExecResult, _parent_pid, rlimit_args
from taurl.tools.sandbox_pool import SandboxPool
from taurl.tools.zygote_protocol import (
    _HDR,
    LOST,
    _check_response,
    _Lost,
    _lost_result,
    _read_frame,
    _result,
)

_ZYGOTE_CPU_S = 24 * 3600  # the zygote's own RLIMIT_CPU; requests get SandboxLimits.cpu_s
_HOST_GRACE_S = 1.5  # beyond the timeout: the zygote kills, drains, cleans up (ms normally)
_START_TIMEOUT_S = 15.0
_PYTHON = "/usr/bin/python3"


def _server_source() -> str:
    return resources.files("taurl.tools").joinpath("zygote_server.py").read_text()


@dataclasses.dataclass
class _Zygote:
    """One running bwrap + zygote: its pipes and how to kill its pid namespace."""

    proc: subprocess.Popen
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    init_pidfd: int | None
    stderr_tail: bytearray
    stderr_task: asyncio.Future | None = None

    def kill(self) -> None:
        """SIGKILL the namespace's init (everything in it dies), or bwrap's group."""
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            if self.init_pidfd is not None:
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            else:  # --die-with-parent: init dies with bwrap
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def close(self) -> None:
        self.kill()
        self.writer.close()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(subprocess.TimeoutExpired):
            await loop.run_in_executor(None, self.proc.wait, 5.0)
        if self.proc.poll() is None:  # bwrap did not reap its namespace: kill bwrap too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await loop.run_in_executor(None, self.proc.wait)
        if self.init_pidfd is not None:
            os.close(self.init_pidfd)
            self.init_pidfd = None
        if self.stderr_task is not None:
            self.stderr_task.cancel()


class WarmPython:
    """A zygote in `sandbox`'s workspace (a new sandbox from `config` when None).

    Use as ``async with WarmPython.start(...) as wp``. Requests are served one at a time
    (an `asyncio.Lock`); `restarts` counts zygotes replaced after a failure, `requests`
    the requests served.
    """

    def __init__(
        self,
        sandbox: Sandbox | None = None,
        *,
        config: SandboxConfig | None = None,
        template: str | os.PathLike | None = None,
    ) -> None:
        if sandbox is not None and (config is not None or template is not None):
            raise SandboxError("pass either a sandbox or config/template, not both")
        self._owned = sandbox is None
        self.sandbox = sandbox if sandbox is not None else Sandbox.create(config, template=template)
        if not self.sandbox.isolated:
            if self._owned:
                self.sandbox.close()
            raise SandboxError(
                "WarmPython runs only under bwrap isolation; for unsafe_no_isolation use "
                "Sandbox.run (the zygote's cleanup relies on a private pid namespace)"
            )
        self.restarts = 0
        self.requests = 0
        self._zygote: _Zygote | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._closed = False

    @classmethod
    def start(
        cls,
        sandbox: Sandbox | None = None,
        *,
        config: SandboxConfig | None = None,
        template: str | os.PathLike | None = None,
    ) -> WarmPython:
        """A WarmPython to enter with ``async with``; the zygote starts on entry."""
        return cls(sandbox, config=config, template=template)

    async def __aenter__(self) -> WarmPython:
        try:
            async with self._lock:
                await self._ensure()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def pid(self) -> int | None:
        """Host pid of the running bwrap (None when no zygote runs)."""
        return self._zygote.proc.pid if self._zygote is not None else None

    # -- starting and stopping ------------------------------------------------------

    def _env(self, extra: Mapping[str, str]) -> dict[str, str]:
        return {"PATH": _SYSTEM_PATH, "HOME": WORKSPACE, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1",
                **dict(self.sandbox.config.env), **extra}  # fmt: skip

    async def _spawn(self) -> _Zygote:
        cfg = self.sandbox.config
        lim = dataclasses.replace(cfg.limits, cpu_s=_ZYGOTE_CPU_S, nproc=cfg.limits.nproc + 1)
        if not os.access(_PYTHON, os.X_OK):  # the sandbox sees the host's /usr, not the venv
            raise SandboxError(
                f"the warm Python sandbox runs the system's {_PYTHON} (the venv is not mounted "
                "in the sandbox), and this host has none: apt-get install python3"
            )
        info_r, info_w = os.pipe()
        cmd = [_PYTHON, "-I", "-B", "-u", "-c", _server_source()]
        argv = self.sandbox._iso.argv(
            dataclasses.replace(cfg, limits=lim), self.sandbox.workspace, info_w, cmd
        )
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env({}),
                pass_fds=(info_w,),
                start_new_session=True,
            )
        except OSError as e:
            os.close(info_r)
            raise SandboxError(f"cannot start the zygote's bwrap: {e}") from None
        finally:
            os.close(info_w)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 16)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), proc.stdout)
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(loop), proc.stdin
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        tail = bytearray()
        z = _Zygote(proc, reader, writer, None, tail)
        err_reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(err_reader), proc.stderr)
        z.stderr_task = asyncio.ensure_future(_keep_tail(err_reader, tail))
        try:
            ready = await asyncio.wait_for(_read_frame(reader, 4096), _START_TIMEOUT_S)
            if ready.get("ready") is not True or ready.get("non_dumpable") is not True:
                raise _Lost(f"the zygote did not start properly: {ready!r}")
            z.init_pidfd = _init_pidfd(info_r, proc.pid)
        except (_Lost, asyncio.TimeoutError, OSError) as e:
            await z.close()
            detail = bytes(tail).decode(errors="replace").strip()[-2000:]
            raise SandboxError(
                f"the warm Python sandbox did not start ({e or type(e).__name__}); "
                f"its stderr: {detail!r}. Check that plain Sandbox.run works here first"
            ) from None
        finally:
            os.close(info_r)
        return z

    async def _ensure(self) -> _Zygote:
        if self._closed:
            raise SandboxError("this WarmPython is closed; start a new one")
        if self._zygote is None:
            self._zygote = await self._spawn()
        return self._zygote

    async def _discard(self) -> None:
        z, self._zygote = self._zygote, None
        if z is not None:
            await z.close()

    async def restart(self) -> None:
        """Kill the sandbox's processes and start a fresh zygote (workspace kept)."""
        async with self._lock:
            await self._discard()
            self.restarts += 1
            await self._ensure()

    async def close(self) -> None:
        """Kill the zygote's sandbox; delete the workspace if `start` created it."""
        self._closed = True
        await self._discard()
        if self._owned:
            self.sandbox.close()
            self._owned = False

    # -- requests -------------------------------------------------------------------

    async def run_code(
        self,
        code: str,
        *,
        stdin: bytes | str | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run Python source as ``python3 -c code`` would, in a fresh fork of the zygote."""
        if not isinstance(code, str):
            raise SandboxError(f"code must be a str of Python source (got {type(code).__name__})")
        return await self._request({"code": code, "argv": None}, stdin, timeout_s, env,
                                   max_output_bytes)  # fmt: skip

    async def run_argv(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Exec `argv` (looked up on the sandbox's PATH) in a fresh fork of the zygote."""
        if isinstance(argv, str) or not argv:
            raise SandboxError("argv must be a non-empty list such as ['python3', 'main.py']")
        args = [str(a) for a in argv]
        return await self._request({"code": None, "argv": args}, stdin, timeout_s, env,
                                   max_output_bytes)  # fmt: skip

    async def _request(
        self,
        body: dict[str, Any],
        stdin: bytes | str | None,
        timeout_s: float | None,
        env: Mapping[str, str] | None,
        max_output_bytes: int | None,
    ) -> ExecResult:
        lim = self.sandbox.config.limits
        extra = dict(env or {})
        if bad := _env_problems(extra):
            raise SandboxError("; ".join(bad))
        timeout = lim.timeout_s if timeout_s is None else float(timeout_s)
        if not timeout > 0:
            raise SandboxError(f"timeout_s must be > 0 (got {timeout_s!r})")
        keep = lim.max_output_bytes if max_output_bytes is None else int(max_output_bytes)
        if keep <= 0:
            raise SandboxError(f"max_output_bytes must be > 0 (got {max_output_bytes!r})")
        if isinstance(stdin, str):
            stdin = stdin.encode()
        rl = [[name, soft, hard] for name, (soft, hard) in rlimit_args(lim)]
        rl = [[n, s + 1, h + 1] if n == "nproc" else [n, s, h] for n, s, h in rl]
        body.update(
            env=self._env(extra),
            stdin=base64.b64encode(stdin).decode() if stdin is not None else None,
            timeout_s=timeout,
            max_output_bytes=keep,
            max_drain_bytes=max(lim.max_drain_bytes, keep),
            rlimits=rl,
        )
        async with self._lock:
            z = await self._ensure()
            self._next_id += 1
            body["id"] = self._next_id
            t0 = time.monotonic()
            try:
                resp = await asyncio.wait_for(
                    self._exchange(z, body, keep), timeout + _HOST_GRACE_S
                )
            except (_Lost, asyncio.TimeoutError, OSError, ConnectionError) as e:
                why = str(e) or "no answer before the deadline (hung zygote)"
                await self._discard()
                self.restarts += 1
                with contextlib.suppress(SandboxError):
                    await self._ensure()  # ready for the next request; else it retries
                return _lost_result(why, time.monotonic() - t0)
            except BaseException:  # cancelled mid-exchange: the protocol state is unknown
                await asyncio.shield(self._discard())
                raise
            self.requests += 1
            return _result(resp, keep, time.monotonic() - t0)

    async def _exchange(self, z: _Zygote, body: dict[str, Any], keep: int) -> dict[str, Any]:
        data = json.dumps(body).encode()
        z.writer.write(_HDR.pack(len(data)) + data)
        await z.writer.drain()
        # base64 of two capped streams plus a little JSON: anything larger is a lie.
        resp = await _read_frame(z.reader, 3 * keep + 4096)
        _check_response(resp, body["id"])
        return resp


def _init_pidfd(info_r: int, bwrap_pid: int) -> int | None:
    """A pidfd on the namespace's init, named by bwrap's --info-fd (already written: bwrap
    writes it before it runs the command, and the zygote has answered)."""
    os.set_blocking(info_r, False)
    info = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(info_r, 4096):
            info += chunk
    with contextlib.suppress(ValueError, OSError, KeyError, TypeError):
        pid = int(json.loads(info)["child-pid"])
        fd = os.pidfd_open(pid)
        if _parent_pid(pid) == bwrap_pid:  # only ever signal bwrap's own child
            return fd
        os.close(fd)
    return None


async def _keep_tail(reader: asyncio.StreamReader, tail: bytearray, keep: int = 8192) -> None:
    while chunk := await reader.read(4096):
        tail += chunk
        del tail[:-keep]


@contextlib.asynccontextmanager
async def acquire_warm(pool: SandboxPool) -> AsyncIterator[WarmPython]:
    """A WarmPython over a pooled sandbox; the zygote dies before the workspace resets."""
    async with pool.acquire() as sb, WarmPython.start(sb) as wp:
        yield wp


__all__ = ["LOST", "WarmPython", "acquire_warm"]
