"""taurl's asynchronous pipeline (``schedule: async``) on the demo workload, timed per update.

The same workload as `benchmarks/grpo_step.py` (the sync step): the demo's SFT checkpoint
(copied), the demo's own config (``RUN/config.yaml``: search-v0, 8 tasks x 8 rollouts per
update, up to 3 actions of 48 tokens, no injected latency), run through the recipe
(`taurl.recipe.loop.train`) with ``sft: none`` and ``schedule: async``: the engine on one core
generates ahead while the learner process trains on the other, staleness ≤ η.

    python benchmarks/async_step.py --from runs/demo --steps 8 --eta 1

Timing: an update's seconds are the gap between consecutive RL rows of metrics.jsonl (each
is written when an update ends); the first update is excluded (the ramp-up, as the sync
benchmark excludes its first step), so ``s_per_step`` is the steady-state time per update.
``batch_tokens`` counts every real token of each trained batch (prompt, actions,
observations: ``rollout/episodes`` x ``rollout/tokens_mean``), as `grpo_step.py` and TRL
count their rows. Prints one JSON object with the keys `benchmarks/vs_trl.py` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run_async(
    src: Path, steps: int, eta: int, overprovision: int = 0, interrupt: str = "interrupt",
    objective: str = "decoupled_ppo", threads: int = 1, engine_options: dict | None = None,
) -> dict:
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.loop import train
    from taurl.recipe.sections import flat_options
    from taurl.recipe.validate import load_config

    base = load_config(TrainConfig, path=src / "config.yaml")
    sft_version = json.loads((src / "state.json").read_text())["sft_version"]
    tmp = Path(tempfile.mkdtemp(prefix="taurl-async-step-"))
    try:
        policy = tmp / "policy"
        shutil.copytree(src / "checkpoints" / f"v{sft_version}", policy)
        data = {
            **json.loads(json.dumps(flat_options(base))),
            "model": str(policy),
            "sft": "none",
            "demos": 0,
            "updates": steps,
            "schedule": "async",
            "staleness_eta": eta,
            "overprovision": overprovision,
            "interrupt": interrupt,
            "objective": objective,
            "torch_threads": threads,
            # lock-step batching is a sync-only mode (configs/demo.yaml turns it on)
            "deterministic": False,
            # room for the η + 1 batches (+ k groups) the admission rule lets run at once
            "concurrency": base.tasks_per_update * base.group_size * (eta + 1)
            + base.group_size * overprovision,
            "eval_tasks": 1,
            "eval_trials": 1,
            "rl_max_seconds": 0,
            "keep_checkpoints": 1,
            "alarms": {"enabled": False},
            "expert_options": {},
            "warmup_options": {},
            "engine_options": {**base.engine_options, **(engine_options or {})},
        }
        cfg = load_config(TrainConfig, data=data)
        run_dir = tmp / "run"
        c0 = time.process_time()
        train(cfg, str(run_dir), progress=False)
        cpu_main = time.process_time() - c0
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        rl = [r for r in rows if r.get("phase") == "rl"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gaps = [b["time"] - a["time"] for a, b in zip(rl, rl[1:], strict=False)]
    tokens = [r["rollout/episodes"] * r["rollout/tokens_mean"] for r in rl[1:]]
    s_per_step = statistics.mean(gaps)
    return {
        "side": "taurl",
        "schedule": "async",
        "eta": eta,
        "overprovision": overprovision,
        "interrupt": interrupt,
        "objective": objective,
        "steps": len(rl),
        "step_times_s": [round(g, 3) for g in gaps],
        "s_per_step": round(s_per_step, 4),
        "batch_tokens": round(statistics.mean(tokens), 1),
        "trained_tokens": round(statistics.mean(tokens), 1),
        "trained_tokens_per_s": round(statistics.mean(tokens) / s_per_step, 1),
        "rollout_s": round(statistics.mean(r.get("rollout/wall_s", 0.0) for r in rl[1:]), 4),
        "learn_s": round(statistics.mean(r.get("time/learn_s", 0.0) for r in rl[1:]), 4),
        "learner_idle_s": round(
            statistics.mean(r.get("time/learner_idle_s", 0.0) for r in rl[1:]), 4
        ),
        "checkpoint_s": round(statistics.mean(r.get("time/checkpoint_s", 0.0) for r in rl[1:]), 4),
        "update_s": round(statistics.mean(r.get("time/update_s", 0.0) for r in rl[1:]), 4),
        "cpu_s": round(cpu_main / max(len(rl), 1), 4),
        "max_staleness": max(r.get("rollout/staleness_max", 0.0) for r in rl),
        "dropped_stale_groups": sum(r.get("rollout/dropped_stale_groups", 0.0) for r in rl),
        "reward": [round(r.get("rollout/reward_mean", float("nan")), 3) for r in rl],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--from", dest="src", default="runs/demo",
        help="a finished run (its SFT policy is the start)",
    )
    ap.add_argument("--steps", type=int, default=8, help="updates (the first is ramp-up, excluded)")
    ap.add_argument("--eta", type=int, default=1, help="staleness bound η")
    ap.add_argument("--overprovision", type=int, default=0, help="extra groups in flight")
    ap.add_argument("--interrupt", default="interrupt", choices=["finish", "interrupt"])
    ap.add_argument("--objective", default="decoupled_ppo")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in each process")
    a = ap.parse_args()
    out = run_async(
        Path(a.src).resolve(), a.steps, a.eta, a.overprovision, a.interrupt, a.objective, a.threads
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
