"""`TinkerServer`: the service on uvicorn in a background thread, on loopback by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
        self._serving: Any = None  # a `taurl.proxy.http_thread.ServingThread` once started

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> TinkerServer:
        from taurl.proxy.http_thread import serve_in_thread

        self._serving = serve_in_thread(self.app, self.host, self.port, name="taurl-tinker-http",
                                        what="the Tinker server")
        self.port = self._serving.port
        return self

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None
        self.service.close()

    def __enter__(self) -> TinkerServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
