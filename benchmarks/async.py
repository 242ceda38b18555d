"""Synchronous vs asynchronous RL pipelines: simulated (``--sim``) or real (``--real``).

    python benchmarks/async.py --sim                          # every schedule, default workload
    python benchmarks/async.py --sim --sweep-learn 5e-4 1e-3 2e-3   # learner cost sweep
    python benchmarks/async.py --sim --workload '{"gen_sigma": 1.0}' --eta 2
    python benchmarks/async.py --real ...     # the real pipeline (benchmarks/_async_real.py)
    python benchmarks/async.py --check        # the simulator vs the real pipeline (_sim_check.py)

Prints one JSON object per line per schedule, with at least ``schedule``, ``eta``,
``trained_tokens_per_s``, ``speedup_vs_sync`` and ``max_staleness``.

``--sim`` runs `taurl.sim` (a discrete-event simulator on a virtual clock: seconds of
simulated time, not of this machine; see its docstrings for the model and the published
shapes of the default workload). Each row adds the learner idle fraction, the generator
bubble fraction, staleness mean/p95/max, tokens wasted, the length bias of trained vs
generated samples and ``rollout_share_sync`` — the share of a synchronous step the learner
waits (rollout plus weight sync), which bounds what any overlap can gain.

``--real`` runs ``run_real(args)`` from ``benchmarks/_async_real.py`` (the real async
pipeline's harness, written with the async pipeline) and prints its rows the same way;
arguments this script does not know are passed on to it as ``args.rest``.

``--check`` runs ``run_check(args)`` from ``benchmarks/_sim_check.py``: a real sync and
async run (or ``--from-runs DIR``), a `Workload` calibrated from the sync run, and per
schedule the simulator's prediction vs the measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from taurl.errors import Error
from taurl.sim import Schedule, Workload, compare, standard_schedules

REAL = Path(__file__).with_name("_async_real.py")
CHECK = Path(__file__).with_name("_sim_check.py")


def _round(v: Any) -> Any:
    return float(f"{v:.4g}") if isinstance(v, float) else v


def sim_rows(
    workload: Workload, schedules: list[Schedule], updates: int, seed: int
) -> list[dict[str, Any]]:
    """One row per schedule (sync first) on the same episodes."""
    results = compare(workload, schedules, updates=updates, seed=seed)
    share = next(r.learner_idle_frac for r in results if r.kind == "sync")
    return [{"mode": "sim", **r.as_dict(), "rollout_share_sync": share,
             "learn_s_per_token": workload.learn_s_per_token} for r in results]


def load_real(path: Path | None = None) -> Any:
    """The harness module at `path` (default `REAL`), or an Error saying it is not there."""
    path = path or REAL
    if not path.exists():
        raise Error(
            f"{path} does not exist in this checkout: --real needs the real async pipeline's "
            "harness (run_real(args) -> list[dict], written with the async pipeline of issue 11); "
            "merge that work or run --sim"
        )
    spec = importlib.util.spec_from_file_location("_async_real", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run_real", None)):
        raise Error(f"{path} has no function run_real(args) -> list[dict]")
    return module


def real_rows(module: Any, argv: list[str] | None, rest: list[str]) -> list[dict[str, Any]]:
    """Run the harness: with its own options (``add_arguments``) parsed from `argv`, else
    with the arguments this script does not know as ``args.rest``. It prints its rows as
    each run ends (a run takes minutes), so they are not printed again here."""
    if not hasattr(module, "add_arguments"):
        return module.run_real(argparse.Namespace(rest=rest))
    rp = argparse.ArgumentParser(prog="async.py --real")
    rp.add_argument("--real", action="store_true")
    module.add_arguments(rp)
    rows = module.run_real(rp.parse_args(argv))
    return [] if rows is None else rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sim", action="store_true", help="the discrete-event simulator (taurl.sim)")
    mode.add_argument(
        "--real", action="store_true", help="the real pipeline (benchmarks/_async_real.py)"
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="the simulator vs the real pipeline (benchmarks/_sim_check.py)",
    )
    p.add_argument("--updates", type=int, default=30, help="learner steps per schedule (sim)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (sim)")
    p.add_argument(
        "--eta", type=int, default=4, help="staleness bound of the async schedules (sim)"
    )
    p.add_argument(
        "--overprovision", type=float, default=0.25,
        help="extra groups of the overprovision schedule",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=None,
        metavar="K",
        help="row cap of the capped async rows (sim; default: one batch of episodes, the real "
        "pipeline's engine_options.max_batch_size; 0 leaves those rows out)",
    )
    p.add_argument("--workload", default="{}", help="JSON of Workload fields to override (sim)")
    p.add_argument(
        "--markdown", action="store_true", help="print a Markdown table instead of JSON lines"
    )
    p.add_argument("--sweep-learn", type=float, nargs="*", default=None, metavar="S_PER_TOKEN",
                   help="run every schedule at each learner cost (learn_s_per_token)")
    args, rest = p.parse_known_args(argv)
    args.rest = rest
    if args.check:
        return check(argv if argv is not None else sys.argv[1:])
    try:
        if args.real:
            module = load_real()
            rows = real_rows(module, argv if argv is not None else sys.argv[1:], rest)
            if hasattr(module, "add_arguments"):
                return 0  # printed by the harness as it went
        else:
            if rest:
                p.error(f"unknown arguments for --sim: {' '.join(rest)}")
            fields = {f.name for f in dataclasses.fields(Workload)}
            over = json.loads(args.workload)
            if not isinstance(over, dict) or (bad := sorted(set(over) - fields)):
                raise Error(
                    "--workload must be a JSON object of Workload fields; "
                    f"unknown: {bad if isinstance(over, dict) else over!r}. Fields: "
                    f"{', '.join(sorted(fields))}"
                )
            base = dataclasses.replace(Workload(), **over).check()
            cap = base.batch_episodes if args.max_batch is None else args.max_batch
            scheds = standard_schedules(
                eta=args.eta, overprovision=args.overprovision, max_batch=cap
            )
            rows = []
            for lpt in args.sweep_learn or [base.learn_s_per_token]:
                rows += sim_rows(
                    dataclasses.replace(base, learn_s_per_token=lpt), scheds, args.updates,
                    args.seed,
                )
    except (Error, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.markdown:
        print(markdown(rows))
        return 0
    for row in rows:
        print(json.dumps({k: _round(v) for k, v in row.items()}), flush=True)
    return 0


def check(argv: list[str]) -> int:
    """``--check``: parse `_sim_check.py`'s options and run it (it prints its rows)."""
    spec = importlib.util.spec_from_file_location("_sim_check", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cp = argparse.ArgumentParser(prog="async.py --check")
    cp.add_argument("--check", action="store_true")
    module.add_arguments(cp)
    try:
        module.run_check(cp.parse_args(argv))
    except Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


COLUMNS = [
    "schedule", "speedup_vs_sync", "trained_tokens_per_s", "learner_idle_frac",
    "generator_bubble_frac", "staleness_mean", "staleness_p95", "max_staleness",
    "tokens_wasted_frac", "episodes_dropped", "episodes_aborted", "length_bias",
]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (the columns BENCHMARKS.md shows)."""
    cols = [c for c in COLUMNS if any(c in r for r in rows)]
    if (
        any("rollout_share_sync" in r for r in rows)
        and len({r.get("learn_s_per_token") for r in rows}) > 1
    ):
        cols = ["rollout_share_sync", *cols]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append(
            "| "
            + " | ".join(
                f"{_round(r[c]):.3g}" if isinstance(r.get(c), float) else str(r.get(c, ""))
                for c in cols
            )
            + " |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
