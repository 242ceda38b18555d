"""The real pipeline, sync vs async, on the search env with injected tool latency.

`run_real(args)` runs the recipe (`taurl.recipe.loop.train`) once per schedule from the demo's
SFT policy (copied; ``--policy``), on ``search-latency-v0``: search-v0 whose every tool
call waits a heavy-tailed time (`taurl.recipe.schedule.latency.ToolLatency`: log-normal, mean
``--latency-ms``, σ ``--latency-sigma``, capped at 5 s, seeded by the episode). Each run
does ``--updates`` GRPO updates of 8 tasks × 8 rollouts (the demo's batch); what is
measured is the RL phase only (its wall time from state.json's timings, evaluations and
setup left out):

    trained_tokens_per_s = Σ over updates of the batch's action tokens / RL wall seconds
    speedup_vs_sync      = trained_tokens_per_s / that of the sync run
    max_staleness        = max over updates of rollout/staleness_max (must be ≤ η)

One JSON object per schedule. Called by ``benchmarks/async.py --real``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

DEMO_POLICY = "runs/demo/checkpoints/v1"  # the demo run of this clone (`taurl demo`)


def _config(args: Any, schedule: str, eta: int, policy: str) -> Any:
    from taurl.recipe.config import TrainConfig

    return TrainConfig(
        model=policy,
        env="search-latency-v0",
        sft="none",
        demos=0,
        system_prompt="",
        env_config={
            "top_k": 1,
            "max_doc_chars": 120,
            "latency_mean_s": args.latency_ms / 1000,
            "latency_sigma": args.latency_sigma,
            "latency_max_s": 5.0,
        },
        task_options={"families": ["city_country"], "split_by": "city"},
        max_turns=3,
        max_action_tokens=48,
        max_episode_tokens=128,
        max_context=1024,
        lr=2.5e-4,
        updates=args.updates,
        tasks_per_update=8,
        group_size=8,
        eval_tasks=1,
        eval_trials=1,
        # async: room for the η + 1 batches (+ k groups) the admission rule lets run at once
        concurrency=64 * (eta + 1) + 8 * args.overprovision if schedule == "async" else 64,
        schedule=schedule,
        staleness_eta=eta,
        overprovision=args.overprovision if schedule == "async" else 0,
        interrupt=args.interrupt,
        objective=args.async_objective if schedule == "async" else "ppo",
        seed=args.seed,
        alarms={"enabled": False},
        torch_threads=1,
        keep_checkpoints=1,
    )


def _one(args: Any, schedule: str, eta: int, policy: str, root: Path) -> dict[str, Any]:
    from taurl.recipe.loop import train

    run_dir = root / f"{schedule}-{eta}"
    t0 = time.perf_counter()
    train(_config(args, schedule, eta, policy), str(run_dir), progress=False)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    rl_s = json.loads((run_dir / "state.json").read_text())["timings"]["rl"]
    tokens = sum(r["rollout/episodes"] * r.get("rollout/action_tokens_mean", 0.0) for r in rl)
    return {
        "schedule": schedule,
        "eta": eta,
        "updates": len(rl),
        "trained_tokens": tokens,
        "rl_wall_s": rl_s,
        "trained_tokens_per_s": tokens / rl_s,
        "max_staleness": max(r.get("rollout/staleness_max", 0.0) for r in rl),
        "staleness_mean": sum(r.get("rollout/staleness_mean", 0.0) for r in rl) / len(rl),
        "dropped_stale_groups": sum(r.get("rollout/dropped_stale_groups", 0.0) for r in rl),
        "aborted_groups": sum(r.get("rollout/aborted_groups", 0.0) for r in rl),
        "learner_idle_s": sum(r.get("time/learner_idle_s", 0.0) for r in rl),
        "learn_s": sum(r.get("time/learn_s", 0.0) for r in rl),
        "success_mean": sum(r.get("rollout/success", 0.0) for r in rl) / len(rl),
        "latency_ms": args.latency_ms,
        "latency_sigma": args.latency_sigma,
        "interrupt": args.interrupt,
        "total_wall_s": time.perf_counter() - t0,
    }


def run_real(args: Any) -> list[dict[str, Any]]:
    """Sync, then async at each η of ``args.etas``; one dict per run (module docstring)."""
    from taurl.recipe.schedule.latency import register_latency_env

    register_latency_env()
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        policy = root / "policy"
        shutil.copytree(args.policy, policy)  # the demo's run stays read-only
        for schedule, eta in ([("sync", 0)] if not args.no_sync else []) + [
            ("async", e) for e in args.etas
        ]:
            row = _one(args, schedule, eta, str(policy), root)
            base = out[0]["trained_tokens_per_s"] if out else row["trained_tokens_per_s"]
            if args.no_sync:
                base = args.sync_tokens_per_s or float("nan")
            row["speedup_vs_sync"] = row["trained_tokens_per_s"] / base
            row["objective"] = "ppo" if schedule == "sync" else args.async_objective
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def add_arguments(p: Any) -> None:
    p.add_argument("--policy", default=DEMO_POLICY, help="the SFT policy to start from (copied)")
    p.add_argument("--updates", type=int, default=6)
    p.add_argument("--etas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--latency-ms", type=float, default=200.0, help="mean injected tool latency")
    p.add_argument("--latency-sigma", type=float, default=1.0, help="log-normal sigma (the tail)")
    p.add_argument("--overprovision", type=int, default=2, help="async: extra groups in flight")
    p.add_argument("--interrupt", default="finish", choices=["finish", "interrupt"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--async-objective", default="decoupled_ppo", help="the async runs' objective (sync: ppo)"
    )
    p.add_argument("--keep", default="", help="keep the run directories under this directory")
    p.add_argument(
        "--no-sync",
        action="store_true",
        help="skip the sync run (speedup against --sync-tokens-per-s)",
    )
    p.add_argument("--sync-tokens-per-s", type=float, default=0.0)
