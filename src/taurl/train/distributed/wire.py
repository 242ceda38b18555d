"""The driver-rank channel: its environment variables and its messages.

Every message is pickled by value (`send` / `recv`); models travel as ``torch.save`` bytes
(`to_bytes` / `from_bytes`), one copy per rank. Shared by the ranks
(`taurl.train.distributed.worker`) and the driver's side (`pool`, `driver`, `sft`).
"""

from __future__ import annotations

import io
import pickle
from multiprocessing.connection import Connection
from typing import Any

import torch

ADDR_ENV, KEY_ENV = "TAURL_DIST_ADDR", "TAURL_DIST_KEY"
DEVICE_ENV = "TAURL_DIST_DEVICE"  # cpu | cuda | auto (default): a CUDA rank takes cuda:LOCAL_RANK
ORPHAN_ENV = "TAURL_DIST_DIE_WITH_PARENT"  # set by taurl's launcher: one driver, die with it
WAIT_ENV = "TAURL_DIST_WAIT_S"  # ranks you launch: exit after this long with no driver


def send(conn: Connection, obj: Any) -> None:
    """`obj` pickled by value: `Connection.send` would pass tensors as shared-memory handles
    (torch's reductions), which need the multiprocessing parent's key and outlive nothing."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def to_bytes(obj: Any) -> bytes | None:
    """`obj` (a model, a state dict) as `torch.save` bytes; None stays None."""
    if obj is None:
        return None
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes | None, device: torch.device) -> Any:
    if data is None:
        return None
    return torch.load(io.BytesIO(data), map_location=device, weights_only=False)
