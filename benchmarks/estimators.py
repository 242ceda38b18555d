"""Advantage estimators compared on the search env: GRPO vs GiGPO vs RLOO, several seeds.

    python benchmarks/estimators.py --from runs/demo --out runs/estimators --updates 20 --seeds 0 1 2
    python benchmarks/estimators.py --estimators grpo --seeds 0 --updates 30 --override '{"lr": 5e-4}'

Every run starts from the same SFT checkpoint (the `--from` run's version after SFT) and
its config; only the estimator and the RL seed (task sampling and rollouts) change, so the
curves differ by the credit assignment alone. Each run is an ordinary taurl run directory
(resumed after SFT). Writes OUT/report.html (learning curves, mean ± std over seeds) and
prints a Markdown table of the final figures for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import shutil
import statistics
import time
from pathlib import Path

from taurl.config import load_config
from taurl.pipeline import PipelineConfig, run_pipeline

CURVES = ["rollout/reward_mean", "rollout/search_rate", "rollout/invalid_rate", "learn/entropy"]


def seed_run(src: Path, dst: Path, sft_version: int) -> None:
    """A run directory holding only `src`'s policies up to SFT and its SFT evaluation."""
    shutil.rmtree(dst, ignore_errors=True)
    (dst / "checkpoints").mkdir(parents=True)
    for v in range(sft_version + 1):
        shutil.copytree(src / "checkpoints" / f"v{v}", dst / "checkpoints" / f"v{v}")
    (dst / "evals").mkdir()
    shutil.copy(src / "evals" / "sft.json", dst / "evals" / "sft.json")
    state = json.loads((src / "state.json").read_text())
    keep = {k: state[k] for k in ("sft_version", "sft_steps", "sft_planned_steps") if k in state}
    (dst / "state.json").write_text(json.dumps(keep))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="src", default="runs/demo", help="a finished run (its SFT policy is the start)")
    ap.add_argument("--out", default="runs/estimators")
    ap.add_argument("--estimators", nargs="+", default=["grpo", "gigpo", "rloo"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--override", default="{}", help='JSON of other config keys for every run, e.g. \'{"lr": 5e-4}\'')
    args = ap.parse_args()
    src, out = Path(args.src), Path(args.out)
    base = load_config(PipelineConfig, path=src / "config.yaml")
    sft_version = json.loads((src / "state.json").read_text())["sft_version"]
    results: dict[str, list[dict]] = {}
    for est in args.estimators:
        for seed in args.seeds:
            run = out / f"{est}-s{seed}"
            seed_run(src, run, sft_version)
            cfg = load_config(PipelineConfig, data={**json.loads(json.dumps(base.__dict__)), **json.loads(args.override),
                                                    "estimator": est, "seed": seed, "updates": args.updates,
                                                    "grpo_max_seconds": 0})
            t0 = time.perf_counter()
            summary = run_pipeline(cfg, str(run), progress=False)
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            results.setdefault(est, []).append({"summary": summary, "rows": [r for r in rows if r["phase"] == "grpo"],
                                                "wall": time.perf_counter() - t0})
            f = summary["holdout"]["final"]
            print(f"{est} seed {seed}: holdout success {f['success']:.3f} search {f['search_rate']:.3f}", flush=True)
    (out / "results.json").write_text(json.dumps({e: [{"summary": r["summary"], "wall": r["wall"]} for r in rs]
                                                  for e, rs in results.items()}, indent=1))
    write_report(out / "report.html", results)
    print(markdown_table(results))


def _stat(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.pstdev(xs):.3f}"


def markdown_table(results: dict[str, list[dict]]) -> str:
    lines = ["| estimator | seeds | holdout success | holdout search rate | last-5 train reward | last-5 train search rate |",
             "|---|---|---|---|---|---|"]
    for est, rs in results.items():
        succ = [r["summary"]["holdout"]["final"]["success"] for r in rs]
        search = [r["summary"]["holdout"]["final"]["search_rate"] for r in rs]
        rew = [statistics.mean(x["rollout/reward_mean"] for x in r["rows"][-5:]) for r in rs]
        srch = [statistics.mean(x["rollout/search_rate"] for x in r["rows"][-5:]) for r in rs]
        lines.append(f"| {est} | {len(rs)} | {_stat(succ)} | {_stat(search)} | {_stat(rew)} | {_stat(srch)} |")
    return "\n".join(lines)


def write_report(path: Path, results: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    imgs = []
    for key in CURVES:
        fig, ax = plt.subplots(figsize=(6, 3))
        for est, rs in results.items():
            n = min(len(r["rows"]) for r in rs)
            ys = np.array([[row.get(key, np.nan) for row in r["rows"][:n]] for r in rs])
            xs = np.arange(1, n + 1)
            mean, std = np.nanmean(ys, axis=0), np.nanstd(ys, axis=0)
            ax.plot(xs, mean, label=f"{est} ({len(rs)} seeds)")
            ax.fill_between(xs, mean - std, mean + std, alpha=0.2)
        ax.set_title(key)
        ax.set_xlabel("update")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        plt.close(fig)
        imgs.append(base64.b64encode(buf.getvalue()).decode())
    body = "".join(f'<img src="data:image/png;base64,{i}">' for i in imgs)
    table = markdown_table(results).replace("\n", "<br>")
    path.write_text(f"<!doctype html><html><body><h1>Estimators on search-v0</h1><p>{table}</p>{body}</body></html>")


if __name__ == "__main__":
    main()
