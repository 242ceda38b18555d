"""The chaos harness: ``taurl ...`` in a child process that a kill point may SIGKILL.

Kept with the tests (`test_chaos.py`, `benchmarks/chaos.py`), not in `taurl.chaos`: the
package's kill points are library code, and library code does not import the CLI.
"""

from __future__ import annotations

import multiprocessing
import os
import sys

from taurl.chaos import KILL_ENV, TRACE_ENV


def run_cli(
    argv: list[str], *, kill_at: str = "", trace: str = "", timeout_s: float = 900.0
) -> int:
    """Run ``taurl <argv>`` in a child process; its exit code (``-9``: SIGKILLed at `kill_at`).

    The child is forked from a server that has imported taurl once (multiprocessing's
    forkserver), so each restart costs no import time; it is a separate process all the
    same, with its own memory, file descriptors and a real SIGKILL.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["taurl.cli.main", "taurl.cli.commands", "taurl.recipe.loop", "taurl.monitor.report"]
    )
    p = ctx.Process(target=_child, args=(list(argv), {KILL_ENV: kill_at, TRACE_ENV: trace}))
    p.start()
    p.join(timeout_s)
    if p.is_alive():
        p.kill()
        p.join()
        raise TimeoutError(f"taurl {' '.join(argv)} ran over {timeout_s} s")
    return int(p.exitcode)


def _child(argv: list[str], env: dict[str, str]) -> None:
    for k, v in env.items():
        if v:
            os.environ[k] = v
        else:
            os.environ.pop(k, None)
    from taurl.cli.main import main

    sys.exit(main(argv))
