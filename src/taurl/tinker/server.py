"""`TinkerServer`: the service on uvicorn in a background thread, on loopback by default."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any

from taurl.errors import Error


class TinkerServer:
    """Serves `models` ({name: what taurl loads}) with checkpoints and records in `run_dir`.

    >>> with TinkerServer({"tiny": "runs/demo/checkpoints/v1"}, "runs/t") as s:  # doctest: +SKIP
    ...     client = tinker.ServiceClient(base_url=s.url, api_key="tml-local")
    """

    def __init__(self, models: dict[str, str], run_dir: str | Path, *, host: str = "127.0.0.1",
                 port: int = 0):
        from taurl.tinker.app import build_app
        from taurl.tinker.service import TinkerService

        self.service = TinkerService(models, run_dir)
        self.app = build_app(self.service)
        self.host, self.port = host, port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> TinkerServer:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve([sock])),
                                        name="taurl-tinker-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise Error(f"the Tinker server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._server = None
        self.service.close()

    def __enter__(self) -> TinkerServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
