"""RL settings compared from one SFT policy: estimators (GRPO vs GiGPO vs RLOO) and config
variants (e.g. learning rates), several seeds, chosen on the validation split.

    python benchmarks/estimators.py --from runs/demo --out runs/estimators --updates 20 \
        --seeds 0 1 2
    python benchmarks/estimators.py --estimators grpo --seeds 0 --updates 30 \
        --override '{"lr": 5e-4}' --override '{"lr": 1e-3}'      # two variants

Every run starts from the same SFT checkpoint (the `--from` run's version after SFT) and
its config; only the estimator, the override and the RL seed (rollout sampling) change, so
the curves differ by those alone. The task plan keeps the SFT run's seed, so every seed's
RL trains on tasks the SFT policy never saw; before a variant runs, `sft_task_overlap`
checks it (an override that would move demonstration or evaluation tasks is refused).
Choose by the validation column; the holdout column is reported, never used to choose. Each
run is an ordinary taurl run directory (resumed after SFT). Writes OUT/report.html (learning
curves, mean ± std over seeds) and prints a Markdown table of the final figures for
BENCHMARKS.md and docs/experiments/.
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

from taurl.envs.tasks import plan_tasks
from taurl.errors import ConfigError
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train
from taurl.recipe.sections import flat_options
from taurl.recipe.validate import load_config
from taurl.rollout.seeds import episode_seed

CURVES = ["rollout/reward_mean", "rollout/search_rate", "rollout/invalid_rate", "learn/entropy"]


def seed_run(
    src: Path, dst: Path, sft_version: int, evals: Path | None = None, copy_evals: bool = True
) -> None:
    """A run directory holding only `src`'s policies up to SFT and an SFT evaluation: `src`'s
    own, or the ``{split}-sft.json`` files of directory `evals` (an SFT evaluation made with
    other evaluation settings); copy_evals False: none (the run evaluates the SFT policy)."""
    shutil.rmtree(dst, ignore_errors=True)
    (dst / "checkpoints").mkdir(parents=True)
    for v in range(sft_version + 1):
        shutil.copytree(src / "checkpoints" / f"v{v}", dst / "checkpoints" / f"v{v}")
    (dst / "evals").mkdir()
    for split in ("validation", "holdout") if copy_evals else ():
        shutil.copy(
            (evals or src / "evals") / f"{split}-sft.json", dst / "evals" / f"{split}-sft.json"
        )
    state = json.loads((src / "state.json").read_text())
    keep = {k: state[k] for k in ("sft_version", "sft_steps", "sft_examples") if k in state}
    (dst / "state.json").write_text(json.dumps(keep))


def task_plan(cfg: TrainConfig):
    """The task plan `taurl.recipe.loop.train` draws for `cfg` (the same call, the same seeds)."""
    return plan_tasks(
        cfg.env, task_file=cfg.tasks, task_options=cfg.task_options,
        n_demos=cfg.demos if cfg.sft.data == "expert" else 0,
        n_rl=cfg.updates * cfg.tasks_per_update, n_eval=cfg.eval_tasks,
        seed=episode_seed(cfg.seed, "train"), eval_seed=cfg.eval_seed,
    )


def sft_task_overlap(sft_cfg: TrainConfig, cfg: TrainConfig) -> list[str]:
    """Task ids `cfg`'s RL would train on that the SFT policy (trained by `sft_cfg`) saw as
    demonstrations, or that are in `sft_cfg`'s validation/holdout splits. Empty when clean.

    The variant resumes from `sft_cfg`'s SFT checkpoint but draws its own plan, so an
    override of the seed, the demo count, the task options or the task file would silently
    move demonstration tasks into its RL pool (or change the evaluation tasks).
    """
    sft_plan, plan = task_plan(sft_cfg), task_plan(cfg)

    def ids(ts: list) -> set[str]:
        return {t.task_id for t in ts}

    seen = ids(sft_plan.demos) | ids(sft_plan.validation + sft_plan.holdout)
    # a plan of its own (another seed, demo count, task source) is refused even where its RL
    # tasks happen to miss the demonstrations: the SFT policy's plan is the one to keep
    moved = (ids(plan.demos) ^ ids(sft_plan.demos)) | (
        ids(plan.validation + plan.holdout) ^ ids(sft_plan.validation + sft_plan.holdout)
    )
    return sorted(ids(plan.rl) & seen | moved)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--from", dest="src", default="runs/demo",
        help="a finished run (its SFT policy is the start)",
    )
    ap.add_argument("--out", default="runs/estimators")
    ap.add_argument("--estimators", nargs="+", default=["grpo", "gigpo", "rloo"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument(
        "--override", action="append", default=[],
        help="JSON of other config keys, e.g. '{\"lr\": 5e-4}'; repeat for several variants",
    )
    args = ap.parse_args()
    src, out = Path(args.src), Path(args.out)
    base = load_config(TrainConfig, path=src / "config.yaml")
    sft_version = json.loads((src / "state.json").read_text())["sft_version"]
    results: dict[str, list[dict]] = {}
    for est in args.estimators:
        for override in args.override or ["{}"]:
            name = est if override == "{}" else f"{est} {override}"
            for seed in args.seeds:
                run = out / "".join(
                    c if c.isalnum() or c in "-." else "_" for c in f"{name}-s{seed}"
                )
                seed_run(src, run, sft_version)
                # the task plan's seed stays the SFT run's, so RL never trains on its
                # demonstration tasks;
                # the variant's seed changes the rollout sampling only
                data = {**json.loads(json.dumps(flat_options(base))), **json.loads(override),
                        "estimator": est,
                        "updates": args.updates, "rl_max_seconds": 0, "rl_seed": seed}
                cfg = load_config(TrainConfig, data=data)
                if overlap := sft_task_overlap(base, cfg):
                    raise ConfigError(
                        f"variant {name!r} would train on {len(overlap)} task(s) the SFT policy "
                        f"was trained or evaluated on (e.g. {overlap[0]!r}): do not override seed, "
                        "demos, tasks or task_options; the RL seed is --seeds"
                    )
                t0 = time.perf_counter()
                summary = train(cfg, str(run), progress=False)
                rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
                results.setdefault(name, []).append(
                    {
                        "summary": summary,
                        "wall": time.perf_counter() - t0,
                        "rows": [r for r in rows if r["phase"] == "rl"],
                    }
                )
                v, h = summary["validation"]["final"], summary["holdout"]["final"]
                print(
                    f"{name} seed {seed}: validation {v['success']:.3f}  "
                    f"holdout {h['success']:.3f}",
                    flush=True,
                )
    (out / "results.json").write_text(
        json.dumps(
            {
                e: [{"summary": r["summary"], "wall": r["wall"]} for r in rs]
                for e, rs in results.items()
            },
            indent=1,
        )
    )
    write_report(out / "report.html", results)
    print(markdown_table(results))


def _stat(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.pstdev(xs):.3f}"


def markdown_table(results: dict[str, list[dict]]) -> str:
    lines = [
        "| variant | seeds | validation success (choose) | holdout success (report) | "
        "holdout search rate | last-5 train reward | last-5 train search rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for est, rs in results.items():
        val = [r["summary"]["validation"]["final"]["success"] for r in rs]
        succ = [r["summary"]["holdout"]["final"]["success"] for r in rs]
        search = [r["summary"]["holdout"]["final"]["search_rate"] for r in rs]
        rew = [statistics.mean(x["rollout/reward_mean"] for x in r["rows"][-5:]) for r in rs]
        srch = [statistics.mean(x["rollout/search_rate"] for x in r["rows"][-5:]) for r in rs]
        lines.append(
            f"| {est} | {len(rs)} | {_stat(val)} | {_stat(succ)} | {_stat(search)} | "
            f"{_stat(rew)} | {_stat(srch)} |"
        )
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
    path.write_text(
        "<!doctype html><html><body><h1>Estimators on "
        f"search-v0</h1><p>{table}</p>{body}</body></html>"
    )


if __name__ == "__main__":
    main()
