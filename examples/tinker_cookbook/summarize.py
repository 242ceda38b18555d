"""The figures of a cookbook run, from the files the cookbook writes in its log path.

SFT (`metrics.jsonl`): `train_mean_nll` per step, and the mean of the first and last
`--window` steps. RL (`iteration_*/train_rollout_summaries.jsonl`, one line per episode):
the mean reward and share correct of the first and last `--window` iterations, and a 95%
bootstrap interval of their difference. The bootstrap resamples groups (the episodes of one
prompt share it, so they are not independent), in each window separately: percentile
interval of mean(last) - mean(first) over 2000 resamples (Efron & Tibshirani 1993, ch. 13).

    python summarize.py sft runs/cookbook_sft
    python summarize.py rl runs/cookbook_rl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from statistics import mean


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sft(log_path: Path, window: int) -> dict:
    nll = [r["train_mean_nll"] for r in read_jsonl(log_path / "metrics.jsonl")
           if "train_mean_nll" in r]
    return {"steps": len(nll), "nll": [round(x, 4) for x in nll],
            "first": round(mean(nll[:window]), 4), "last": round(mean(nll[-window:]), 4)}


def groups(log_path: Path, key: str) -> list[list[list[float]]]:
    """Per iteration, per group, the episodes' `key` ("reward" or "correct")."""
    out = []
    for it in sorted(log_path.glob("iteration_*/train_rollout_summaries.jsonl")):
        by_group: dict[int, list[float]] = {}
        for r in read_jsonl(it):
            value = r["total_reward"] if key == "reward" else r["steps"][-1]["metrics"][key]
            by_group.setdefault(r["group_idx"], []).append(float(value))
        out.append(list(by_group.values()))
    return out


def window_diff(per_iter: list[list[list[float]]], window: int, seed: int = 0) -> dict:
    """Mean over episodes of the first and last `window` iterations, their difference and its
    95% group-bootstrap interval."""
    first = [g for it in per_iter[:window] for g in it]
    last = [g for it in per_iter[-window:] for g in it]
    flat = lambda gs: [x for g in gs for x in g]  # noqa: E731
    rng = random.Random(seed)
    diffs = sorted(mean(flat(rng.choices(last, k=len(last))))
                   - mean(flat(rng.choices(first, k=len(first)))) for _ in range(2000))
    return {"first": round(mean(flat(first)), 3), "last": round(mean(flat(last)), 3),
            "diff": round(mean(flat(last)) - mean(flat(first)), 3),
            "ci95": [round(diffs[49], 3), round(diffs[1949], 3)],
            "episodes_per_window": [len(flat(first)), len(flat(last))]}


def rl(log_path: Path, window: int) -> dict:
    per_iter = {k: groups(log_path, k) for k in ("reward", "correct", "format")}
    curve = [round(mean(x for g in it for x in g), 3) for it in per_iter["correct"]]
    return {"iterations": len(curve), "correct_per_iteration": curve,
            **{k: window_diff(v, window) for k, v in per_iter.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["sft", "rl"])
    parser.add_argument("log_path", type=Path)
    parser.add_argument("--window", type=int, default=None,
                        help="steps a side (default: 2 for sft, 5 for rl)")
    args = parser.parse_args()
    window = args.window or (2 if args.kind == "sft" else 5)
    result = sft(args.log_path, window) if args.kind == "sft" else rl(args.log_path, window)
    for key, value in result.items():
        print(f"{key}: {json.dumps(value)}")


if __name__ == "__main__":
    main()
