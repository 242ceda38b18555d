"""Rollout throughput: episodes/s and sampled tokens/s at several concurrency levels.

The same engine, model, env and budgets serve every level, so the ratio between levels
measures what continuous batching buys. Run from the repo root:

    .venv/bin/python benchmarks/rollout.py                  # default tiny policy
    .venv/bin/python benchmarks/rollout.py --model runs/x/checkpoints/v3 --concurrency 1 8 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

# as taurl itself does, before torch loads: spinning OpenMP workers wreck shared cores
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", default="", help="local HF model dir (default: build the tiny default policy)"
    )
    ap.add_argument(
        "--size", default="tiny", help="default policy preset when --model is not given"
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32], help="levels to measure")
    ap.add_argument("--episodes-per-slot", type=int, default=3,
                    help="episodes per concurrent slot (level 32 runs 32 x this many episodes)")
    ap.add_argument("--max-action-tokens", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)"
    )
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from taurl import envs
    from taurl.envs.search import generate_tasks
    from taurl.envs.search.hooks import SearchPolicyHooks
    from taurl.policy.engine import LocalEngine
    from taurl.policy.model import build_default_policy, count_parameters, load_policy
    from taurl.rollout.loop import RolloutConfig, run_episodes

    if args.model:
        model, tok = load_policy(args.model)
    else:
        path = tempfile.mkdtemp(prefix="taurl-bench-")
        texts = SearchPolicyHooks().tokenizer_texts(envs.make("search-v0"), [])
        build_default_policy(texts, path, size=args.size, seed=args.seed)
        model, tok = load_policy(path)
    print(f"model: {count_parameters(model):,} parameters, torch threads {torch.get_num_threads()}")
    cfg = RolloutConfig(max_turns=args.max_turns, max_action_tokens=args.max_action_tokens,
                        max_episode_tokens=args.max_turns * args.max_action_tokens)
    tasks = generate_tasks(
        "train", n=max(args.concurrency) * args.episodes_per_slot, seed=args.seed
    )
    engine = LocalEngine(model, tok, max_batch_size=max(args.concurrency))
    # warm-up
    asyncio.run(run_episodes(engine, lambda: envs.make("search-v0"), tok, tasks[:4], config=cfg))

    rows = []
    for c in args.concurrency:
        n = c * args.episodes_per_slot
        t0 = time.perf_counter()
        res = asyncio.run(run_episodes(engine, lambda: envs.make("search-v0"), tok, tasks[:n],
                                       config=cfg, concurrency=c, seed=args.seed))
        wall = time.perf_counter() - t0
        toks = sum(t.num_action_tokens for t in res.trajectories)
        rows.append((c, n, wall, n / wall, toks / wall))
    print(
        f"{'concurrency':>11} {'episodes':>8} {'wall s':>7} {'episodes/s':>10} "
        f"{'gen tokens/s':>12} {'vs first':>8}"
    )
    for c, n, wall, eps, tps in rows:
        print(f"{c:>11} {n:>8} {wall:>7.2f} {eps:>10.2f} {tps:>12.0f} {tps / rows[0][4]:>7.1f}x")


if __name__ == "__main__":
    main()
