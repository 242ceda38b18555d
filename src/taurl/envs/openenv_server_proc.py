"""A local OpenEnv server process, started on first use and shared by every env of this
process: ``server_url("my_pkg.server.app:app") -> "http://127.0.0.1:PORT"``.

The app (a FastAPI app made by openenv's ``create_app``) runs under uvicorn in a child
process on a free loopback port; the adapter waits for its ``/health`` answer, and the
process is ended (SIGTERM, then SIGKILL) when this process exits. A server that does not
come up in `START_TIMEOUT_S` is an error that shows the tail of its output.

This process may also end without running its exit handlers (SIGTERM's default action,
SIGKILL, a crash); the child then ends itself: it holds the read end of a pipe whose only
writer is this process, and kills its own process group when the pipe reaches EOF
(`_serve_until_parent_exits`), so no server outlives the process that started it.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from taurl.errors import ConfigError

START_TIMEOUT_S = 60.0
_SERVERS: dict[str, tuple[subprocess.Popen, str]] = {}
_LOCK = threading.Lock()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def server_url(app: str) -> str:
    """The URL of the running server of `app` ("module:attr"), started if need be."""
    if ":" not in app:
        raise ConfigError(f"env_config app {app!r} must be 'module:attr', e.g. "
                          "'my_env.server.app:app'")
    with _LOCK:
        if app in _SERVERS and _SERVERS[app][0].poll() is None:
            return _SERVERS[app][1]
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = tempfile.TemporaryFile()  # noqa: SIM115 — the server's output, read only if it fails to start
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
        # stdin: a pipe this process never writes to, held open until it exits (module docstring)
        proc = subprocess.Popen([sys.executable, "-m", __name__, app, str(port)],
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop(proc)
                log.seek(0)
                tail = log.read().decode(errors="replace")[-1500:]
                raise ConfigError(f"the OpenEnv server {app!r} did not start (exit {proc.poll()}): "
                                  f"{tail}")
            time.sleep(0.2)
        _SERVERS[app] = (proc, url)
        return url


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@atexit.register
def stop_all() -> None:
    """End every server this process started."""
    with _LOCK:
        for proc, _ in _SERVERS.values():
            _stop(proc)
        _SERVERS.clear()


def _serve_until_parent_exits(app: str, port: int) -> None:
    """The child's main: uvicorn serving `app` on `port`, and a thread that waits for EOF on
    stdin (every writer gone: the parent exited, however it ended) and then kills this
    process group — the server and anything it started (`start_new_session` made the group)."""
    def watch() -> None:
        sys.stdin.buffer.read()
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    _serve_until_parent_exits(sys.argv[1], int(sys.argv[2]))
