"""Sync vs async schedules: one JSON object per line for each schedule.

    .venv/bin/python benchmarks/async.py --real      # the real pipeline, search env + injected tool latency

--real: `benchmarks/_async_real.py` (the recipe from the demo's SFT policy, sync and async
at η = 1, 2, 4; trained tokens/s, speedup vs sync, max staleness). The discrete-event
simulator (--sim) lives beside it on its own branch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    import _async_real

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--real", action="store_true", help="run the real pipeline (sync and async)")
    _async_real.add_arguments(p)
    args = p.parse_args(argv)
    if not args.real:
        p.error("choose --real")
    logging.basicConfig(level=logging.WARNING)
    _async_real.run_real(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
