"""The in-sandbox half of the warm Python executor (`taurl.tools.zygote`).

It runs INSIDE a bwrap sandbox as ``/usr/bin/python3 -I -B -u -c <this file's text>``, so
it may use only the standard library of the system Python (the venv is not mounted).
The host writes requests to its stdin and reads responses from its stdout; each frame is
a 4-byte big-endian length and a UTF-8 JSON object.

    request   {"id": n, "code": str | null, "argv": [str] | null, "stdin": b64 | null,
               "env": {str: str}, "timeout_s": float, "max_output_bytes": int,
               "max_drain_bytes": int, "rlimits": [[name, soft, hard], ...]}
    response  {"id": n, "exit_code": int, "stdout": b64, "stderr": b64,
               "stdout_bytes": int, "stderr_bytes": int, "killed_reason": str | null,
               "clean": bool}

Each request runs in a fresh ``os.fork()`` child of this process, so no Python state
passes from one request to the next. After the child exits (or is killed at the deadline,
or floods its output), the server SIGKILLs every other process of the sandbox with
``kill(-1)``: in this pid namespace that reaches everything except itself and bwrap's init
(kill(2)), double-forked and setsid'd daemons included, and it waits until /proc lists
nobody else, then empties /tmp and /dev/shm. Only then does it answer, so nothing a
request started outlives it. ``clean`` is false if that did not succeed; the host then
throws the whole sandbox away.

The server makes itself non-dumpable (prctl PR_SET_DUMPABLE 0): a request runs as the
same uid, and a dumpable server could be ptraced or have its /proc/PID/{mem,fd} opened,
i.e. its pipes to the host forged. The host still treats every byte it reads as untrusted.
"""

import base64
import ctypes
import errno
import gc
import json
import os
import resource
import selectors
import signal
import struct
import sys
import time
import traceback
import types

_HDR = struct.Struct(">I")
_MAX_REQUEST = 256 << 20
_SETTLE_S = 2.0  # after kill(-1): how long to wait for the sandbox to empty
_SCRATCH = ("/tmp", "/dev/shm")
_PR_SET_DUMPABLE = 4


def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _write_frame(fd, obj):
    data = json.dumps(obj).encode()
    view = memoryview(_HDR.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_frame(fd):
    hdr = _read_exact(fd, _HDR.size)
    if hdr is None:
        return None
    (n,) = _HDR.unpack(hdr)
    if n > _MAX_REQUEST:
        raise ValueError(f"request of {n} bytes is too large")
    data = _read_exact(fd, n)
    return None if data is None else json.loads(data)


# -- the child: one request ------------------------------------------------------------


def _run_code(code):
    """Run `code` the way ``python3 -c code`` would, then leave without returning."""
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    sys.path.insert(0, "")  # python -c puts the working directory first
    status = 0
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        status = _exit_status(e)
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ else None  # hide this frame
        traceback.print_exception(type(e), e, tb)
        status = 1
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()  # join non-daemon threads, as at exit
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except SystemExit as e:
        status = _exit_status(e)
    except BaseException:
        status = status or 120  # what Python exits with when flushing stdout fails
    os._exit(status & 0xFF)


def _exit_status(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _child(req, fds):
    """In the forked child: plumb the pipes, apply the limits, run; never returns."""
    try:
        stdin_r, out_w, err_w = fds
        os.setsid()
        os.dup2(stdin_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        # Everything else goes, the server's pipes to the host above all.
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        for name, soft, hard in req["rlimits"]:
            resource.setrlimit(getattr(resource, "RLIMIT_" + name.upper()), (soft, hard))
        os.chdir("/workspace")
        env = req["env"]
        for k in [k for k in os.environ if k not in env]:
            del os.environ[k]
        for k, v in env.items():
            if os.environ.get(k) != v:  # usually equal: the zygote starts with this env
                os.environ[k] = v
        if req.get("argv") is not None:
            argv = req["argv"]
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # as subprocess(restore_signals)
                signal.signal(sig, signal.SIG_DFL)
            try:
                os.execvpe(argv[0], argv, dict(os.environ))
            except OSError as e:
                os.write(2, f"{argv[0]}: {e.strerror}\n".encode())
                os._exit(126 if e.errno == errno.EACCES else 127)
        _run_code(req["code"])
    except BaseException:
        with _suppress():
            os.write(2, traceback.format_exc().encode())
    os._exit(127)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


# -- the server: spawn, watch, clean up ------------------------------------------------


def _fork():
    """fork(), retried briefly: killed processes count against RLIMIT_NPROC until reaped."""
    for attempt in range(50):
        try:
            return os.fork()
        except BlockingIOError:
            time.sleep(0.002 * (attempt + 1))
    return os.fork()


class _Child:
    """The request's process. It is our only child: orphans go to bwrap's init, which
    reaps them, so waiting on this pid alone never steals anyone else's status."""

    def __init__(self, pid):
        self.pid = pid
        self.status = None

    def poll(self):
        if self.status is None:
            pid, raw = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(raw)
        return self.status


def _others():
    me = os.getpid()
    return [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]


def _kill_all(child):
    """SIGKILL every process of the sandbox but init and us; wait until they are gone."""
    deadline = time.monotonic() + _SETTLE_S
    while True:
        with _suppress():  # ESRCH: nobody else is left
            os.kill(-1, signal.SIGKILL)
        child.poll()
        if not _others():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def _empty_dir(path):
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            with _suppress():
                os.chmod(e.path, 0o700)  # a request may have made it unreadable
            _empty_dir(e.path)
            with _suppress():
                os.rmdir(e.path)
        else:
            with _suppress():
                os.unlink(e.path)


class _Stream:
    def __init__(self, keep):
        self.keep = keep
        self.buf = bytearray()
        self.total = 0

    def add(self, chunk):
        self.total += len(chunk)
        room = self.keep - len(self.buf)
        if room > 0:
            self.buf += chunk[:room]


# Over 60 lines on purpose: runs inside the sandbox as a standalone script (stdlib only): fork,
# feed stdin, drain both pipes under the output cap and the deadline, kill and reap, in one
# place so the kill paths are read together.
def _serve(req):
    stdin = base64.b64decode(req["stdin"]) if req.get("stdin") is not None else b""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = _fork()
    if pid == 0:
        _child(req, (in_r, out_w, err_w))
    child = _Child(pid)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    keep, drain = req["max_output_bytes"], req["max_drain_bytes"]
    streams = {out_r: _Stream(keep), err_r: _Stream(keep)}
    sel = selectors.DefaultSelector()
    pidfd = os.pidfd_open(pid)
    sel.register(pidfd, selectors.EVENT_READ)
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(in_w, False)
        sel.register(in_w, selectors.EVENT_WRITE)
    else:
        os.close(in_w)
    deadline = time.monotonic() + req["timeout_s"]
    killed, clean, drain_until = None, None, None
    while True:
        fds = {k.fd for k in sel.get_map().values()}
        if child.poll() is not None and clean is None:
            clean = _kill_all(child)  # leftovers die, so every pipe reaches EOF
            drain_until = time.monotonic() + _SETTLE_S
        if child.status is not None and not fds & streams.keys():
            break
        now = time.monotonic()
        if killed is None and now >= deadline:
            killed = "timeout"
            _kill_all(child)
            drain_until = time.monotonic() + _SETTLE_S
        if drain_until is not None and now > drain_until:
            break  # something unkillable holds a pipe: give up, the host kills the sandbox
        until = drain_until if drain_until is not None else deadline
        for key, _ in sel.select(timeout=max(until - time.monotonic(), 0.0)):
            fd = key.fd
            if fd == pidfd:
                sel.unregister(pidfd)
                child.poll()
            elif fd == in_w:
                try:
                    pending = pending[os.write(in_w, pending[: 1 << 16]) :]
                except BlockingIOError:
                    continue
                except OSError:  # the child closed its stdin
                    pending = pending[:0]
                if not pending:
                    sel.unregister(in_w)
                    os.close(in_w)
            else:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    os.close(fd)
                    continue
                streams[fd].add(chunk)
                if streams[fd].total > drain and killed is None:
                    killed = "output_limit"
                    _kill_all(child)
                    drain_until = time.monotonic() + _SETTLE_S
    leftover = {k.fd for k in sel.get_map().values()}
    sel.close()
    for fd in leftover | {pidfd}:
        with _suppress():
            os.close(fd)
    if clean is None or not clean:
        clean = _kill_all(child) and child.status is not None
    for d in _SCRATCH:
        _empty_dir(d)
    out, err = streams[out_r], streams[err_r]
    status = child.status
    return {
        "id": req["id"],
        "exit_code": 137 if status is None else (128 - status if status < 0 else status),
        "stdout": base64.b64encode(out.buf).decode(),
        "stderr": base64.b64encode(err.buf).decode(),
        "stdout_bytes": out.total,
        "stderr_bytes": err.total,
        "killed_reason": killed,
        "clean": clean,
    }


def main():
    if os.getpid() != 2 or os.getppid() != 1 or os.getuid() == 0:
        # kill(-1) would reach every process of this uid: refuse outside a fresh pid
        # namespace where we are bwrap's first child.
        sys.exit("zygote_server must run as pid 2 of a bwrap sandbox (see taurl.tools.zygote)")
    ctrl_in, ctrl_out = os.dup(0), os.dup(1)  # non-inheritable copies; 0/1 become /dev/null
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    dumpable = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    import atexit  # noqa: F401  (what a request's exit needs, imported once here)

    gc.freeze()  # children then never traverse (and so never copy) the zygote's objects
    _write_frame(ctrl_out, {"ready": True, "pid": os.getpid(), "non_dumpable": dumpable})
    while True:
        req = _read_frame(ctrl_in)
        if req is None:
            return
        _write_frame(ctrl_out, _serve(req))


if __name__ == "__main__":
    main()
