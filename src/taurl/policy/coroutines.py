"""`run_coroutine`: a coroutine run to completion from sync code, inside a running loop or not.

Split from `taurl.policy.vllm_engine` (whose sync `connect` needs it): with no loop running
it is `asyncio.run`; inside one (a notebook, an async caller) the coroutine runs on a loop
of its own in a helper thread, and its result or exception comes back to the caller.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


def run_coroutine(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, inside a running loop or not."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = asyncio.run(coro)
        except BaseException as e:  # re-raised in the caller's thread
            out["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")
