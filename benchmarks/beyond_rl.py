"""Issue 31's comparison: GRPO, rejection-sampling SFT, online trajectory DPO and on-policy
distillation from one SFT checkpoint, with one budget of sampled episodes (docs/beyond_rl.md).

    python benchmarks/beyond_rl.py --runs runs/beyond --teacher-run runs/demo-teacher \
        --curves grpo,distill --at 5,10,15,20,25,30 --out runs/beyond/figures.json

The runs are `taurl train` runs made beforehand (the commands are in BENCHMARKS.md); this
script reads their summary.json (holdout success, task-clustered 95% interval, paired gain
over the SFT checkpoint, wall seconds of the stage) and evaluates the holdout of the
checkpoints after N updates of the `--curves` runs (kept with ``rl.keep_checkpoints: 0``), with
the recipe's evaluation settings (`taurl eval`: the same 100 tasks x 3 trials and seed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STAGE_TIMINGS = ("rl", "rejection")


def run_figures(run: Path) -> dict:
    s = json.loads((run / "summary.json").read_text())
    h = s["holdout"]
    stage_s = sum(s["timings"].get(k, 0.0) for k in STAGE_TIMINGS)
    return {
        "stage": s["train"].get("stage", "rl"),
        "holdout": h["final"]["success"],
        "ci95": h["final"]["ci95"],
        "sft_holdout": h["sft"]["success"],
        "paired_gain": h["paired_gain"],
        "stage_wall_s": stage_s,
        "task_successes": h["final"]["task_successes"],
        "trials": h["final"]["trials"],
        "wall_s": s["wall_seconds"],
        "updates": s["train"]["updates"],
        "promotion": s["promotion"].get("decision"),
    }


def curve(run: Path, at: list[int]) -> dict[int, dict]:
    from taurl.cli.commands import evaluate

    v_sft = json.loads((run / "summary.json").read_text())["train"]["sft_version"]
    out = {}
    for n in at:
        ckpt = run / "checkpoints" / f"v{v_sft + n}"
        if not (ckpt / "config.json").exists():
            continue
        r = evaluate(ckpt, split="holdout", progress=False)
        out[n] = {"holdout": r.success, "ci95": list(r.ci95)}
        print(
            f"{run.name} after {n} updates: holdout {r.success:.3f} "
            f"[{r.ci95[0]:.3f}, {r.ci95[1]:.3f}]",
            flush=True,
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="runs/beyond")
    p.add_argument("--teacher-run", default="runs/demo-teacher")
    p.add_argument("--curves", default="grpo,distill")
    p.add_argument("--at", default="5,10,15,20,25")
    p.add_argument("--out", default="runs/beyond/figures.json")
    a = p.parse_args()
    root = Path(a.runs)
    teacher = json.loads((Path(a.teacher_run) / "summary.json").read_text())["holdout"]["final"][
        "success"
    ]
    figures = {"teacher_holdout": teacher, "runs": {}, "curves": {}}
    for run in sorted(d for d in root.iterdir() if (d / "summary.json").exists()):
        figures["runs"][run.name] = f = run_figures(run)
        print(
            f"{run.name:10s} holdout {f['holdout']:.3f} [{f['ci95'][0]:.3f}, {f['ci95'][1]:.3f}]  "
            f"gain {f['paired_gain']['difference']:+.3f}  stage {f['stage_wall_s']:.0f} s",
            flush=True,
        )
    from taurl.eval.stats import paired_difference

    base = figures["runs"].get("grpo")
    # same tasks and seeds: a paired, task-clustered difference
    for name, f in figures["runs"].items():
        if base is not None and name != "grpo":
            d = paired_difference(
                base["task_successes"], f["task_successes"], f["trials"]
            ).to_dict()
            f["minus_grpo"] = {"difference": d["difference"], "ci95": d["ci95"]}
            print(
                f"{name} - grpo: {d['difference']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
            )
    at = [int(x) for x in a.at.split(",")]
    for name in a.curves.split(","):
        if (root / name / "summary.json").exists():
            c = curve(root / name, at)
            c[figures["runs"][name]["updates"]] = {"holdout": figures["runs"][name]["holdout"],
                                                   "ci95": figures["runs"][name]["ci95"]}
            reach = [n for n in sorted(c) if c[n]["holdout"] >= 0.9 * teacher]
            figures["curves"][name] = {
                "points": c,
                "updates_to_90pct_teacher": reach[0] if reach else None,
            }
    Path(a.out).write_text(json.dumps(figures, indent=2))
    print(json.dumps({k: v.get("updates_to_90pct_teacher") for k, v in figures["curves"].items()}))


if __name__ == "__main__":
    main()
