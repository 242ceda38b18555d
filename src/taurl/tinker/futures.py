"""Futures: every long request answers at once with a request id; the client polls for it.

A POST that starts work (create_model, forward_backward, optim_step, save/load, asample)
answers ``{"request_id": ...}``; the SDK then calls ``/api/v1/retrieve_future`` until the
result is there. Each poll waits up to `LONG_POLL_S` for the result (long polling: one
round trip per result when the work is short); still pending, it answers HTTP 408 with a
``try_again`` body, which the SDK retries at once. A result is kept after it is fetched (a
client may fetch it again: retries after a lost response), up to `KEEP` results.

Idempotency: the SDK sends one ``X-Idempotency-Key`` per call and repeats it when it
retries that call, so a POST whose key was seen answers what the first one answered (the
same request id) and starts nothing: a retried ``optim_step`` never steps twice.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

LONG_POLL_S = 10.0
KEEP = 10_000  # results and idempotency keys kept (oldest dropped first)


@dataclass(frozen=True)
class Payload:
    """A result as the HTTP answer carries it."""

    body: bytes
    media_type: str = "application/json"

    @classmethod
    def json(cls, obj: Any) -> Payload:
        return cls(json.dumps(obj).encode())


class FutureStore:
    """Request ids → results, on the server's event loop (not thread-safe: use it there)."""

    def __init__(self, long_poll_s: float = LONG_POLL_S) -> None:
        self.long_poll_s = long_poll_s  # how long a poll waits for a pending result
        self._futures: OrderedDict[str, asyncio.Future[Payload]] = OrderedDict()
        self._keys: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def new(self) -> tuple[str, asyncio.Future[Payload]]:
        rid = uuid.uuid4().hex
        fut: asyncio.Future[Payload] = asyncio.get_running_loop().create_future()
        self._futures[rid] = fut
        _trim(self._futures)
        return rid, fut

    def resolved(self, payload: Payload) -> str:
        """A new request id whose result is already `payload` (a request refused on arrival)."""
        rid, fut = self.new()
        fut.set_result(payload)
        return rid

    def get(self, rid: str) -> asyncio.Future[Payload] | None:
        return self._futures.get(rid)

    async def wait(self, rid: str) -> Payload | None:
        """The result of `rid`, waiting up to `long_poll_s` (None: still pending)."""
        fut = self._futures[rid]
        if fut.done():
            return fut.result()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.long_poll_s)
        except asyncio.TimeoutError:
            return None

    # -- idempotency ------------------------------------------------------------------
    def replay(self, route: str, key: str | None) -> Any:
        """What the first POST with this key answered (None: first time, or no key)."""
        return self._keys.get((route, key)) if key else None

    def remember(self, route: str, key: str | None, answer: Any) -> None:
        if key:
            self._keys[(route, key)] = answer
            _trim(self._keys)


def _trim(d: OrderedDict) -> None:
    while len(d) > KEEP:
        d.popitem(last=False)
