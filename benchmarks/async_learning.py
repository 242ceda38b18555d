"""Learning with asynchrony: holdout success of sync vs async (η = 1, 4) and naive PPO vs
decoupled PPO at η = 4, from one SFT policy, several RL seeds, the same update budget.

    python benchmarks/async_learning.py --from runs/demo --out runs/async_learning \
        --seeds 0 1 2 --updates 16 --jobs 1
    python benchmarks/async_learning.py --out runs/async_learning --report      # the tables again
    python benchmarks/async_learning.py --out runs/async_lr1e-3 --arms async-eta4 async-eta4-ppo \
        --override '{"lr": 0.001}'      # more policy change per version: naive vs decoupled again

Every run starts from the SAME SFT checkpoint: the `--from` run's version after SFT (the
demo's v1; one SFT policy shared by all seeds and arms, copied, the source stays
read-only), and keeps that run's config and task plan (`estimators.seed_run` and
`estimators.sft_task_overlap`, as `long_credit.py` does: RL never trains on a task the SFT
policy saw as a demonstration or is evaluated on). Only these keys change per arm, on top of
``updates`` (the same for every arm, so the same number of trained episodes:
updates × tasks_per_update × group_size) and ``rl_seed`` (rollout sampling and task order):

| arm | schedule | η | objective |
|---|---|---|---|
| sync | sync | – | ppo (the demo's) |
| async η=1 | async | 1 | decoupled_ppo (token-level π_prox/μ truncated at 2) |
| async η=4 | async | 4 | decoupled_ppo |
| async η=4 naive ppo | async | 4 | ppo |

"Naive" is what `ppo` does under async in `taurl.train.learner`: its old policy is the
behaviour logprobs recorded at sampling (μ, up to η versions old), so the clipped ratio is
π_θ/μ — no proximal policy, no importance weight (AReaL's naive PPO baseline, arXiv
2505.24298 §5). Async arms get concurrency 64·(η + 1) (room for the η + 1 batches the
admission rule lets run), ``overprovision: 0`` and ``interrupt: finish`` (the defaults).

Each run reports the recipe's own final evaluations (validation and holdout: the demo's
100 unseen cities × 3 trials each, its own verifier, task-clustered intervals), the
trained batches' staleness (mean of the per-update means, largest per-update p95, largest
age), the stale groups dropped at consumption and the groups aborted, and wall seconds.
Writes OUT/results.jsonl, one line per finished run (a rerun skips finished runs);
``--report`` prints the Markdown tables (`tables`).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any

from long_credit import (  # benchmarks/ (this script's directory)
    pooled_interval,
    seed_interval,
    task_counts,
)
from taurl.eval.stats import t_quantile

# arm -> (schedule, η, objective)
ARMS: dict[str, tuple[str, int, str]] = {
    "sync": ("sync", 0, "ppo"),
    "async-eta1": ("async", 1, "decoupled_ppo"),
    "async-eta4": ("async", 4, "decoupled_ppo"),
    "async-eta4-ppo": ("async", 4, "ppo"),
}
PER_UPDATE = ["rollout/success", "learn/clip_frac", "learn/is_bounded_frac", "learn/behaviour_kl",
              "mismatch/abs_mean", "learn/learn_s"]


# -- one run (in a worker process) ------------------------------------------------------------

def arm_overrides(arm: str) -> dict[str, Any]:
    """The config keys an arm sets on top of the source run's config (module docstring)."""
    schedule, eta, objective = ARMS[arm]
    out: dict[str, Any] = {"schedule": schedule, "objective": objective, "objective_options": {}}
    if schedule == "async":
        # lock-step batching is the sync schedule's mode (the demo config turns it on); an async
        # run batches whatever is ready, which is the point of the arm
        out.update(
            staleness_eta=eta, concurrency=64 * (eta + 1), overprovision=0, interrupt="finish",
            deterministic=False,
        )
    return out


def _get(row: dict, key: str, default: float = 0.0) -> float:
    v = row.get(key)
    return default if v is None else float(v)


def sampled_episodes(run_dir: Path) -> int:
    """Training episodes stored in the run's ledger: trained, dropped, aborted, and those still
    in flight (or ready) when the last update was taken — what the run sampled."""
    from taurl.data.ledger import Ledger

    with Ledger(run_dir / "ledger.sqlite") as ledger:
        return ledger.count(split="train")


def run_one(
    src: str, out: str, arm: str, seed: int, updates: int, override: dict | None = None
) -> dict[str, Any]:
    import estimators as bench  # benchmarks/estimators.py
    from taurl.errors import ConfigError
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.loop import train
    from taurl.recipe.sections import flat_options
    from taurl.recipe.validate import load_config

    src_p, run = Path(src), Path(out) / f"{arm}-s{seed}"
    base = load_config(TrainConfig, path=src_p / "config.yaml")
    bench.seed_run(src_p, run, json.loads((src_p / "state.json").read_text())["sft_version"])
    data = {**json.loads(json.dumps(flat_options(base))), **(override or {}),
            **arm_overrides(arm),
            "updates": updates, "rl_max_seconds": 0, "rl_seed": seed}
    cfg = load_config(TrainConfig, data=data)
    if overlap := bench.sft_task_overlap(base, cfg):
        raise ConfigError(
            f"{arm} seed {seed} would train on {len(overlap)} task(s) the SFT policy saw "
            f"(e.g. {overlap[0]!r})"
        )
    t0 = time.perf_counter()
    summary = train(cfg, str(run), progress=False)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]

    def age(key: str) -> list[float]:  # the schedule's figure, else the learner's (same definition)
        return [_get(r, f"rollout/staleness_{key}", _get(r, f"learn/staleness_{key}")) for r in rl]

    timings = json.loads((run / "state.json").read_text()).get("timings", {})
    return {
        "arm": arm,
        "seed": seed,
        "schedule": cfg.schedule.kind,
        "eta": cfg.staleness_eta if cfg.schedule.kind == "async" else 0,
        "objective": cfg.objective,
        "updates": len(rl),
        "episodes_per_update": cfg.tasks_per_update * cfg.group_size,
        "override": override or {},
        "trained_episodes": sum(_get(r, "rollout/episodes") for r in rl),
        "sampled_episodes": sampled_episodes(run),
        "validation": summary["validation"],
        "holdout": summary["holdout"],
        "staleness_mean": statistics.mean(age("mean")) if rl else math.nan,
        "staleness_p95": max(age("p95"), default=math.nan),
        "staleness_max": max(age("max"), default=math.nan),
        "dropped_stale_groups": sum(_get(r, "rollout/dropped_stale_groups") for r in rl),
        "aborted_groups": sum(_get(r, "rollout/aborted_groups") for r in rl),
        "wall_s": wall,
        "rl_wall_s": timings.get("rl", math.nan),
        "curves": {k: [r.get(k) for r in rl] for k in PER_UPDATE},
    }


# -- the report -----------------------------------------------------------------------------------

def paired_difference(diffs: list[float]) -> tuple[float, float, float]:
    """Mean of paired differences and its 95% t-interval, m ± t_{n−1}·s/√n (not clipped:
    a difference lives in [−1, 1]). NaN bounds with fewer than two pairs.

    >>> [round(x, 4) for x in paired_difference([0.1, 0.2, 0.3])]
    [0.2, -0.0484, 0.4484]
    """
    m = statistics.mean(diffs)
    if len(diffs) < 2:
        return m, math.nan, math.nan
    h = t_quantile(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return m, m - h, m + h


def task_paired_difference(
    runs: list[dict], base: list[dict], split: str
) -> tuple[float, float, float]:
    """Per evaluation task, success pooled over seeds × trials of `runs` minus that of `base`
    (both evaluated on the same tasks), then `paired_difference` over tasks. It holds the
    trained policies fixed: evaluation noise only, no seed-to-seed training variance."""
    def rates(rs: list[dict]) -> dict[str, float]:
        return {t: s / n for t, (s, n) in task_counts(rs, split).items()}

    a, b = rates(runs), rates(base)
    return paired_difference([a[t] - b[t] for t in sorted(a.keys() & b.keys())])


def _fmt(m: float, lo: float, hi: float, sign: bool = False) -> str:
    f = "{:+.3f}" if sign else "{:.3f}"
    return f"{f.format(m)} [{f.format(lo)}, {f.format(hi)}]"


def _mean(xs: list[Any]) -> float:
    xs = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
    return statistics.mean(xs) if xs else math.nan


def _num(x: float, f: str) -> str:
    return "–" if math.isnan(x) else format(x, f)  # – : the objective does not compute it


def _diff_row(arm: str, base: str, runs: list[dict], base_runs: list[dict]) -> str:
    """One Markdown row of `arm` − `base` paired by seed ("" when no seed is shared)."""
    by_seed = {r["seed"]: r for r in base_runs}
    pairs = [(r, by_seed[r["seed"]]) for r in runs if r["seed"] in by_seed]
    if not pairs:
        return ""
    dh = [a["holdout"]["final"]["success"] - b["holdout"]["final"]["success"] for a, b in pairs]
    dv = [
        a["validation"]["final"]["success"] - b["validation"]["final"]["success"] for a, b in pairs
    ]
    per_task = task_paired_difference([a for a, _ in pairs], [b for _, b in pairs], "holdout")
    return (f"| {arm} − {base} | {len(pairs)} | {_fmt(*paired_difference(dh), sign=True)} | "
            f"{_fmt(*per_task, sign=True)} | {_fmt(*paired_difference(dv), sign=True)} |")


def tables(results: list[dict]) -> str:
    """The Markdown tables for BENCHMARKS.md: success per arm; paired differences of every
    arm vs sync and of naive ppo vs decoupled_ppo at η = 4; the asynchrony figures. Arms in
    `ARMS` order, seeds ascending."""
    by: dict[str, list[dict]] = {}
    for r in sorted(
        results, key=lambda r: (list(ARMS).index(r["arm"]) if r["arm"] in ARMS else 99, r["seed"])
    ):
        by.setdefault(r["arm"], []).append(r)
    first = next(iter(by.values()))[0]
    lines = [
        f"SFT policy (every run): validation {first['validation']['sft']['success']:.3f}, holdout "
        f"{first['holdout']['sft']['success']:.3f}; {first['updates']} updates × "
        f"{first['episodes_per_update']} episodes per run"
        + (f"; every arm with {json.dumps(first['override'])}" if first.get("override") else ""),
        "",
        "| arm | seeds | holdout, mean over seeds [95% t] | holdout pooled [task-clustered 95%] | "
        "per-seed holdout | validation, mean [95% t] | per-seed validation |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, rs in by.items():
        hold, val = (
            [r["holdout"]["final"]["success"] for r in rs],
            [r["validation"]["final"]["success"] for r in rs],
        )
        lines.append(
            f"| {arm} | {len(rs)} | {_fmt(*seed_interval(hold))} | "
            f"{_fmt(*pooled_interval(rs, 'holdout'))} | {' '.join(f'{h:.3f}' for h in hold)} | "
            f"{_fmt(*seed_interval(val))} | {' '.join(f'{v:.3f}' for v in val)} |"
        )
    # every arm against sync, and the naive objective against the decoupled one at η = 4
    comparisons = [(arm, "sync") for arm in by if arm != "sync"] + [
        ("async-eta4-ppo", "async-eta4")
    ]
    rows = [
        row
        for a, b in comparisons
        if a in by and b in by and (row := _diff_row(a, b, by[a], by[b]))
    ]
    if rows:
        lines += [
            "",
            "Differences, paired by seed (the same seed's runs; the same evaluation tasks):",
            "",
            "| arm − baseline | seeds paired | holdout Δ, mean [95% t over seeds] | "
            "holdout Δ per task [95% t over tasks] | validation Δ, mean [95% t over seeds] |",
            "|---|---|---|---|---|",
            *rows,
        ]
    lines += [
        "",
        "| arm | staleness mean | staleness p95 (max over updates) | staleness max | "
        "dropped stale groups (per run) | aborted groups (per run) | PPO clip frac | "
        "IS-bounded frac | behaviour KL | last-3 train success | "
        "trained / sampled episodes (per run) | wall s / run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, rs in by.items():
        c = {k: _mean([_mean(r["curves"][k]) for r in rs]) for k in PER_UPDATE}
        last3 = _mean([_mean(r["curves"]["rollout/success"][-3:]) for r in rs])
        lines.append(
            f"| {arm} | {_mean([r['staleness_mean'] for r in rs]):.2f} | "
            f"{max(r['staleness_p95'] for r in rs):.0f} | "
            f"{max(r['staleness_max'] for r in rs):.0f} | "
            f"{_mean([r['dropped_stale_groups'] for r in rs]):.1f} | "
            f"{_mean([r['aborted_groups'] for r in rs]):.1f} | {c['learn/clip_frac']:.3f} | "
            f"{_num(c['learn/is_bounded_frac'], '.3f')} | {_num(c['learn/behaviour_kl'], '.4f')} | "
            f"{last3:.3f} | {_mean([r['trained_episodes'] for r in rs]):.0f} / "
            f"{_mean([r.get('sampled_episodes', math.nan) for r in rs]):.0f} | "
            f"{_mean([r['wall_s'] for r in rs]):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--from", dest="src", default="runs/demo",
        help="a finished run (its SFT policy is the start)",
    )
    ap.add_argument("--out", default="runs/async_learning")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--updates", type=int, default=16, help="per run, every arm (the demo has 30)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (separate processes)")
    ap.add_argument(
        "--override",
        default="{}",
        help="JSON of other config keys for every arm, e.g. '{\"lr\": 1e-3}'",
    )
    ap.add_argument(
        "--report", action="store_true", help="only print the tables from OUT/results.jsonl"
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "results.jsonl"
    if not args.report:
        done = (
            {(r["arm"], r["seed"]) for r in map(json.loads, log.read_text().splitlines())}
            if log.exists()
            else set()
        )
        # seed-major order: a partial comparison has every arm at the first seeds
        jobs = [(arm, s) for s in args.seeds for arm in args.arms if (arm, s) not in done]
        with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            futs = {
                pool.submit(
                    run_one, args.src, args.out, arm, s, args.updates, json.loads(args.override)
                ): (arm, s)
                for arm, s in jobs
            }
            for f in cf.as_completed(futs):
                r = f.result()
                with log.open("a") as fh:
                    fh.write(json.dumps(r) + "\n")
                print(
                    f"{r['arm']} seed {r['seed']}: validation "
                    f"{r['validation']['final']['success']:.3f} holdout "
                    f"{r['holdout']['final']['success']:.3f} staleness max "
                    f"{r['staleness_max']:.0f} ({r['wall_s']:.0f} s)",
                    flush=True,
                )
    results = [json.loads(x) for x in log.read_text().splitlines()]
    for r in results:  # a result written before the field existed: count it in its run's ledger
        if (
            "sampled_episodes" not in r
            and (run := out / f"{r['arm']}-s{r['seed']}" / "ledger.sqlite").exists()
        ):
            r["sampled_episodes"] = sampled_episodes(run.parent)
    print(tables(results))


if __name__ == "__main__":
    main()
