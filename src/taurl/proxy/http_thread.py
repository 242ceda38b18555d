"""An ASGI app on uvicorn in a background thread, on a socket bound before it starts.

Binding first (port 0 picks a free one) means the caller knows the port before any request
can arrive, and nothing races for it. Used by the training proxy (`taurl.proxy.server`) and
the Tinker service (`taurl.tinker.server`).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from taurl.errors import Error


@dataclass
class ServingThread:
    """A started server: its uvicorn ``Server``, its thread and the port it listens on."""

    server: Any
    thread: threading.Thread
    port: int

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s)


def serve_in_thread(app: Any, host: str, port: int, *, name: str, what: str,
                    serve: Callable[[Any, socket.socket], Awaitable[None]] | None = None,
                    timeout_s: float = 30.0) -> ServingThread:
    """Serve `app` on (`host`, `port`) in a daemon thread named `name`; return once it listens.

    `serve(server, sock)` replaces ``server.serve(sockets=[sock])`` when the loop needs more
    (the proxy opens its MCP sessions around it). Raises `Error` ("`what` did not start")
    when it is not listening within `timeout_s`.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    run = serve or (lambda s, k: s.serve(sockets=[k]))
    thread = threading.Thread(target=lambda: asyncio.run(run(server, sock)), name=name,
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise Error(f"{what} did not start on http://{host}:{port}")
        time.sleep(0.01)
    return ServingThread(server, thread, port)
