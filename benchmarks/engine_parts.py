"""Where the local engine's time goes in a sync or async run of the demo workload.

Wraps `LocalEngine`'s steps (prefill, decode, sampling, dropping finished rows) and the
batch KV cache's row operations (`taurl.policy.kv_cache.BatchKV`) with timers, then runs

    python benchmarks/engine_parts.py sync              # benchmarks/grpo_step.py, 6 steps
    python benchmarks/engine_parts.py async --eta 4     # benchmarks/async_step.py, 12 updates

and prints the run's own figures (one JSON object) and then, per part, its wall seconds
summed over the run and its number of calls. Times are wall time on the engine thread
(nested: `_drop` includes `row` and `remove`), so they are comparable between runs of one
machine, not absolute compute.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("schedule", choices=["sync", "async"])
    ap.add_argument(
        "--from", dest="src", default="runs/demo",
        help="a finished run (its SFT policy is the start)",
    )
    ap.add_argument("--eta", type=int, default=4, help="async: staleness bound")
    ap.add_argument("--interrupt", default="interrupt", choices=["finish", "interrupt"])
    ap.add_argument(
        "--steps", type=int, default=0, help="steps or updates (default: 6 sync, 12 async)"
    )
    a = ap.parse_args()

    from taurl.policy import engine, kv_cache

    seconds: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def timed(cls: type, name: str) -> None:
        f, label = getattr(cls, name), f"{cls.__name__}.{name}"

        def wrapper(*args, **kw):
            t = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                seconds[label] += time.perf_counter() - t
                calls[label] += 1
        setattr(cls, name, wrapper)

    for name in ("_prefill_unique", "_decode", "_sample_and_finish", "_drop"):
        timed(engine.LocalEngine, name)
    for name in ("merge", "remove", "select", "row", "from_prefixes"):
        timed(kv_cache.BatchKV, name)
    src = Path(a.src).resolve()
    if a.schedule == "sync":
        import grpo_step

        out = grpo_step.run_steps(src, a.steps or 6, 1)
    else:
        import async_step

        out = async_step.run_async(src, a.steps or 12, a.eta, interrupt=a.interrupt)
    keys = ("s_per_step", "rollout_s", "learn_s", "trained_tokens_per_s", "step_times_s")
    print(json.dumps({"schedule": a.schedule, **{k: out[k] for k in keys if k in out}}))
    for label, s in seconds.most_common():
        print(f"{label:32s} {s:7.2f} s  {calls[label]:6d} calls")


if __name__ == "__main__":
    main()
