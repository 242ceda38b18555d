"""A minimal asyncio HTTP/1.1 JSON client for a local inference server (stdlib only).

One connection per request (``Connection: close``): no pool bound to an event loop, so
the same engine works across the recipe's successive ``asyncio.run`` calls, and a
request's fate is unambiguous. `HTTPError.sent` says whether the request may have
reached the server: a request that was never sent can be retried without any risk of a
second sample being drawn for it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from taurl.errors import EngineError


class HTTPError(EngineError):
    """A request failed. sent: it may have reached the server; status: HTTP status or None."""

    def __init__(self, message: str, *, sent: bool, status: int | None = None, body: Any = None):
        super().__init__(message)
        self.sent = sent
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Response:
    status: int
    body: Any  # the decoded JSON, or the text when it is not JSON


async def request(method: str, url: str, payload: Any = None, *, timeout_s: float = 60.0,
                  connect_timeout_s: float = 5.0,
                  headers: dict[str, str] | None = None) -> Response:
    """Send one request and return its response; raise `HTTPError` on any transport failure.

    A status >= 400 is returned, not raised: the caller knows what each status means.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise EngineError(f"only plain http://host:port URLs are supported, got {url!r}")
    host, port = parts.hostname, parts.port or 80
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                connect_timeout_s)
    except (OSError, asyncio.TimeoutError) as e:
        raise HTTPError(f"cannot connect to {host}:{port} ({type(e).__name__}: {e})",
                        sent=False) from e
    data = b"" if payload is None else json.dumps(payload).encode()
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
            "Accept: application/json", f"Content-Length: {len(data)}"]
    if payload is not None:
        head.append("Content-Type: application/json")
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()
        status, body = await asyncio.wait_for(_read_response(reader), timeout_s)
    except asyncio.TimeoutError as e:
        raise HTTPError(f"{method} {url} got no answer within {timeout_s:g} s", sent=True) from e
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        raise HTTPError(f"{method} {url} failed after sending ({type(e).__name__}: {e}); the "
                        "server closed the connection or died", sent=True) from e
    finally:
        writer.close()
    text = body.decode("utf-8", errors="replace")
    try:
        return Response(status, json.loads(text) if text else None)
    except json.JSONDecodeError:
        return Response(status, text)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    line = await reader.readline()
    if not line:
        raise asyncio.IncompleteReadError(b"", None)
    status = int(line.split()[1])
    headers: dict[str, str] = {}
    while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    if "chunked" in headers.get("transfer-encoding", ""):
        chunks = []
        while (size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16)) > 0:
            chunks.append(await reader.readexactly(size))
            await reader.readline()
        return status, b"".join(chunks)
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"]))
    return status, await reader.read()
