"""What the local engine's deterministic (lock-step) mode costs, and what it fixes.

Runs the demo's two rollout workloads through `taurl.rollout.episodes.collect` with the
engine's ``deterministic`` off and on, alternating, `--reps` times each:

- ``rl``: one RL round, 8 training tasks x 8 rollouts (64 episodes at concurrency 64);
- ``eval``: one holdout evaluation, 100 tasks x 3 trials (300 episodes at concurrency 64);

with configs/demo.yaml's rollout budgets and env options, from a trained policy (``--model``,
e.g. a demo run's SFT checkpoint RUN/checkpoints/v1). It prints one JSON object: per workload
and mode, the wall seconds of every repetition and their median, and how many distinct
results the repetitions gave (1: every repetition sampled the same ids and logprobs, bit
for bit). Run from the repo root:

    python benchmarks/deterministic.py --model runs/demo/checkpoints/v1 --reps 3
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as taurl itself does, before torch loads


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", required=True, help="a policy checkpoint directory (a demo run's v1)"
    )
    ap.add_argument("--reps", type=int, default=3, help="repetitions per workload and mode")
    ap.add_argument("--workloads", nargs="+", default=["rl", "eval"], choices=["rl", "eval"])
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)  # the demo's torch_threads
    from taurl.data.ledger import Ledger
    from taurl.envs.tasks import plan_tasks
    from taurl.policy.local_engine import LocalEngine
    from taurl.policy.model import load_policy
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.state import make_env
    from taurl.recipe.validate import load_config
    from taurl.rollout.episodes import EpisodeSpec, collect
    from taurl.rollout.seeds import episode_seed

    cfg = load_config(TrainConfig, path=Path(__file__).resolve().parents[1] / "configs/demo.yaml")
    model, tok = load_policy(args.model)
    plan = plan_tasks(
        cfg.env, task_file="", task_options=cfg.task_options, n_demos=0, n_rl=8, n_eval=100,
        seed=episode_seed(cfg.seed, "train"), eval_seed=cfg.eval_seed,
    )
    specs = {
        "rl": [
            EpisodeSpec(f"r-{i}-{g}", t, episode_seed(0, "rl", 1, i, g), f"r:{t.task_id}")
            for i, t in enumerate(plan.rl[:8])
            for g in range(8)
        ],
        "eval": [
            EpisodeSpec(f"e-{i}-{k}", t, episode_seed(cfg.eval_seed, i, k), f"e:{t.task_id}")
            for i, t in enumerate(plan.holdout[:100])
            for k in range(3)
        ],
    }

    def run(workload: str, deterministic: bool) -> tuple[float, str]:
        engine = LocalEngine(
            model, tok, max_batch_size=cfg.concurrency, seed=0, deterministic=deterministic
        )
        with tempfile.TemporaryDirectory() as tmp, Ledger(Path(tmp) / "ledger.sqlite") as ledger:
            t0 = time.perf_counter()
            trajs, _ = asyncio.run(
                collect(
                    engine, tok, lambda: make_env(cfg), specs[workload],
                    config=cfg.rollout_config(), ledger=ledger, run_id="bench",
                    concurrency=cfg.concurrency,
                )
            )
            wall = time.perf_counter() - t0
        digest = hashlib.sha256(json.dumps([[t.token_ids, [s.logprobs for s in t.segments]]
                                            for t in trajs]).encode()).hexdigest()[:12]
        return wall, digest

    run("rl", False)  # warm-up: first-use costs (allocations, the slim decoder's check) fall here
    out: dict = {"model": args.model, "reps": args.reps, "load_before": os.getloadavg()[0]}
    for workload in args.workloads:
        walls: dict[str, list[float]] = {"off": [], "on": []}
        digests: dict[str, set[str]] = {"off": set(), "on": set()}
        for rep in range(args.reps):
            # alternate: drift hits both
            for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                wall, digest = run(workload, mode == "on")
                walls[mode].append(round(wall, 2))
                digests[mode].add(digest)
        out[workload] = {
            mode: {
                "wall_s": walls[mode],
                "median_s": round(statistics.median(walls[mode]), 2),
                "distinct_results": len(digests[mode]),
            }
            for mode in walls
        }
        out[workload]["cost"] = round(
            out[workload]["on"]["median_s"] / out[workload]["off"]["median_s"] - 1, 3
        )
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
