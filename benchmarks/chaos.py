"""Chaos, longer: SIGKILL a real `taurl train` run at N random points and count what broke.

The procedure of tests/test_chaos.py (its helpers are imported from there), with more
kills, a choice of concurrency, and figures instead of asserts:

    PYTHONPATH=src .venv/bin/python benchmarks/chaos.py --kills 20 --seed 1
    PYTHONPATH=src .venv/bin/python benchmarks/chaos.py --kills 12 --concurrency 4

It prints the kills and the phases they hit, restarts, episodes lost (stored before a
kill and missing or changed after it), duplicated (refused duplicates in the ledger),
restarts whose restored optimizer state differs from the checkpoint's, learner steps
whose starting state differs from the uninterrupted run's, whether the final checkpoint
is bitwise the uninterrupted run's, and the wall time. With concurrency > 1 a restarted
round batches its missing episodes differently, so bitwise equality is measured, not
promised (tests/test_chaos.py's docstring).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from taurl.data.ledger import Ledger  # noqa: E402
from taurl.data.runs import RunDir  # noqa: E402
from test_chaos import (  # noqa: E402
    CONFIG,
    PHASES,
    choose_points,
    newest_optimizer_digest,
    read_trace,
    train,
)


def records(run_dir: Path) -> tuple[dict[str, dict], int]:
    if not (run_dir / "ledger.sqlite").exists():
        return {}, 0
    with Ledger(run_dir / "ledger.sqlite") as ledger:
        dups = sum(r.rule == "duplicate_episode" for r in ledger.rejections())
        return {e: ledger.get(e).to_dict() for e in ledger.episode_ids()}, dups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--updates", type=int, default=6)
    ap.add_argument("--workdir", default="")
    args = ap.parse_args()
    t0 = time.perf_counter()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="taurl-chaos-"))
    cfg = work / "config.yaml"
    cfg.write_text(
        yaml.safe_dump({**CONFIG, "concurrency": args.concurrency, "updates": args.updates})
    )
    ref_dir = work / "reference"
    assert train(cfg, ref_dir, trace=str(work / "reference.trace")) == 0
    trace = read_trace(work / "reference.trace")
    names = [n for n, _ in trace if not n.endswith("@version=0")]
    ref_steps = {n: f for n, f in trace if n.startswith("learner_step@")}
    points = choose_points(names, random.Random(args.seed), args.kills)
    run_dir, run = work / "chaos", RunDir(work / "chaos")
    shutil.copytree(ref_dir / "checkpoints" / "v0", run_dir / "checkpoints" / "v0")
    lost = dup = opt_bad = step_bad = missed = 0
    t_chaos = time.perf_counter()
    for i, at in enumerate(points + [""]):
        before, _ = records(run_dir)
        expected = newest_optimizer_digest(run)
        tr = work / f"chaos-{i}.trace"
        rc = train(cfg, run_dir, kill_at=at, trace=str(tr))
        missed += rc != (-9 if at else 0)
        after, dup = records(run_dir)
        lost += sum(after.get(e) != r for e, r in before.items())
        facts = read_trace(tr)
        started = [f for n, f in facts if n.startswith("rl_start@")]
        opt_bad += bool(started and expected is not None and started[0]["optimizer"] != expected)
        step_bad += sum(f != ref_steps[n] for n, f in facts if n in ref_steps)
        print(f"restart {i:2d}: {at or 'to the end':55s} exit {rc}", flush=True)
    t_chaos = time.perf_counter() - t_chaos
    ref_records, _ = records(ref_dir)
    final, _ = records(run_dir)
    v = run.versions()[-1]
    a, b = (load_file(RunDir(d).checkpoint(v) / "model.safetensors") for d in (run_dir, ref_dir))
    out = {
        "kills": len(points),
        "restarts": len(points) + 1,
        "kill points not reached": missed,
        "phases hit": sorted(label for label, test in PHASES if any(test(p) for p in points)),
        "episodes (reference)": len(ref_records),
        "episodes lost": lost + len(set(ref_records) - set(final)),
        "episodes duplicated": dup,
        "episodes extra": len(set(final) - set(ref_records)),
        "episodes with other tokens": sum(
            final[e]["segments"] != r["segments"] for e, r in ref_records.items() if e in final
        ),
        "restarts with optimizer state not restored exactly": opt_bad,
        "learner steps starting from another state": step_bad,
        "final weights bitwise equal": a.keys() == b.keys()
        and all(torch.equal(a[k], b[k]) for k in a),
        "final optimizer state bitwise equal": newest_optimizer_digest(run)
        == newest_optimizer_digest(RunDir(ref_dir)),
        "kept versions": run.versions(),
        "concurrency": args.concurrency,
        "seed": args.seed,
        "chaos wall s": round(t_chaos, 1),
        "total wall s": round(time.perf_counter() - t0, 1),
        "checkpoints MB": round(
            sum(p.stat().st_size for p in (run_dir / "checkpoints").rglob("*") if p.is_file())
            / 1e6,
            1,
        ),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
