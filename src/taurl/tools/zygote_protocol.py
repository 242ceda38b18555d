"""The zygote protocol, host side: length-prefixed JSON frames, and everything read checked.

The zygote runs inside the sandbox, so every byte it sends is untrusted: a frame larger
than expected, malformed JSON, a field of the wrong type, an answer to another request or a
request it could not clean up after is a lost sandbox (`_Lost`), never a crash of the host.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import struct
from typing import Any

from taurl.tools.sandbox_exec import ExecResult

_HDR = struct.Struct(">I")
LOST = "sandbox_lost"  # killed_reason of a request whose sandbox died or misbehaved


class _Lost(Exception):
    """The zygote died or misbehaved; the message says how."""



async def _read_frame(reader: asyncio.StreamReader, max_bytes: int) -> dict[str, Any]:
    try:
        (n,) = _HDR.unpack(await reader.readexactly(_HDR.size))
        if n > max_bytes:
            raise _Lost(f"the zygote sent a {n}-byte frame (at most {max_bytes} expected)")
        obj = json.loads(await reader.readexactly(n))
    except asyncio.IncompleteReadError:
        raise _Lost("the zygote died (its pipe closed)") from None
    except (ValueError, UnicodeDecodeError):
        raise _Lost("the zygote sent a malformed frame") from None
    if not isinstance(obj, dict):
        raise _Lost("the zygote sent a frame that is not a JSON object")
    return obj


_FIELDS = {"id": int, "exit_code": int, "stdout": str, "stderr": str, "stdout_bytes": int,
           "stderr_bytes": int, "clean": bool}  # fmt: skip


def _check_response(resp: dict[str, Any], want_id: int) -> None:
    for name, typ in _FIELDS.items():
        if type(resp.get(name)) is not typ:
            raise _Lost(f"the zygote's answer has a bad {name!r}")
    if resp["id"] != want_id:
        raise _Lost(f"the zygote answered request {resp['id']}, not {want_id}")
    if resp.get("killed_reason") not in (None, "timeout", "output_limit"):
        raise _Lost("the zygote's answer has a bad 'killed_reason'")
    if not 0 <= resp["exit_code"] <= 255:
        raise _Lost("the zygote's answer has an exit code outside 0..255")
    if not resp["clean"]:
        raise _Lost("the zygote could not kill everything the request started")


def _result(resp: dict[str, Any], keep: int, wall_s: float) -> ExecResult:
    try:
        out = base64.b64decode(resp["stdout"], validate=True)[:keep]
        err = base64.b64decode(resp["stderr"], validate=True)[:keep]
    except binascii.Error:
        out = err = b"[taurl: undecodable output from the zygote]"
    n_out, n_err = max(resp["stdout_bytes"], len(out)), max(resp["stderr_bytes"], len(err))
    return ExecResult(
        exit_code=resp["exit_code"],
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        timed_out=resp["killed_reason"] == "timeout",
        killed_reason=resp["killed_reason"],
        truncated_stdout=n_out > len(out),
        truncated_stderr=n_err > len(err),
        wall_s=wall_s,
        stdout_bytes=n_out,
        stderr_bytes=n_err,
        isolated=True,
    )


def _lost_result(why: str, wall_s: float) -> ExecResult:
    msg = f"[taurl: the sandbox running this request was lost and restarted: {why}]\n"
    return ExecResult(137, "", msg, False, LOST, False, False, wall_s, 0, len(msg), True)
