"""Pool `long_credit.py` comparisons run from several SFT policies, and apply a pre-registered
paired decision rule (docs/experiments/long-credit.md: "Sixth pass").

    cd benchmarks && python long_credit_pool.py ../runs/credit6_s0 ../runs/credit6_s1 \
        --base grpo --other gigpo --figure figures/long_credit_pass6.png

Each OUT directory is one SFT policy's `long_credit.py` output (its ``results.jsonl``). A pair
is (directory, RL seed): the two estimators' runs that share the SFT policy, the task order
and the evaluation maps. Prints, as Markdown:

* per SFT policy, each estimator's holdout mean with its 95% t-interval over seeds, and
  whether the two estimators' intervals overlap (the issue's wording);
* the decision: `other − base` on holdout (and validation), paired, with the 95% t-interval
  over all pairs, read by `decide`;
* the two mechanism checks, on the base arm's own batches (``alignment[i]["also"]``, every
  estimator scored on the same credited batch): the mean paired alignment gap
  ``corr(gap_estimator) − corr(base)`` with a t-interval over runs (each run's mean over
  updates), and its correlation with the update's training success — pooled over every
  (run, update), and as the mean of each run's own correlation with a t-interval over runs
  (the clustered one: updates of one run are not independent).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from long_credit import _mean, collapse_update, paired_halfwidth, seed_interval  # noqa: E402


def decide(diffs: list[float]) -> tuple[str, float, float, float]:
    """The pre-registered rule on paired differences d_i = other_i − base_i: the mean and
    its 95% t-interval mean ± t_{0.975, n−1} · s / √n; "above" when the interval lies above
    0 (other beats base), "below" when it lies below, "contains 0" otherwise (not shown)."""
    m, h = statistics.mean(diffs), paired_halfwidth(diffs)
    lo, hi = m - h, m + h
    verdict = "above" if lo > 0 else "below" if hi < 0 else "contains 0"
    return verdict, m, lo, hi


def pearson(x: list[float], y: list[float]) -> float:
    """Pearson's r = cov(x, y) / (σ_x σ_y); NaN when either side is constant or n < 3."""
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def read_runs(d: str) -> list[dict]:
    """One `long_credit.py` OUT directory's runs (its ``results.jsonl``)."""
    return [json.loads(x) for x in (Path(d) / "results.jsonl").read_text().splitlines()]


def load(dirs: list[str]) -> dict[str, list[dict]]:
    """Directory name -> its runs."""
    return {Path(d).name: read_runs(d) for d in dirs}


def paired_diffs(base_runs: list[list[dict]], base: str, runs: list[list[dict]], est: str,
                 split: str = "holdout") -> list[float]:
    """`est`'s final success minus `base`'s on `split`, one value per (SFT policy, seed) that
    both have; the two lists hold each SFT policy's runs in the same order."""
    def by_key(per_policy: list[list[dict]], name: str) -> dict[tuple[int, int], float]:
        return {(i, r["seed"]): r[split]["final"]["success"]
                for i, rs in enumerate(per_policy) for r in rs if r["estimator"] == name}

    ref = by_key(base_runs, base)
    return [v - ref[k] for k, v in by_key(runs, est).items() if k in ref]


def gap_series(run: dict, gap_est: str, base: str) -> tuple[list[float], list[float]]:
    """Per update of one run: (same-batch alignment gap, training success). Empty when the run
    has no same-batch scores, or when its alignment records and curve do not line up (an
    update that credited nothing leaves no record, so they cannot be paired by position)."""
    ups, curve = run["alignment"], run["curve"]
    if len(ups) != len(curve) or not all("also" in u for u in ups):
        return [], []
    gaps = [u["also"][gap_est] - u["also"][base] for u in ups]
    ok = [i for i, g in enumerate(gaps) if not math.isnan(g) and curve[i] is not None]
    return [gaps[i] for i in ok], [curve[i] for i in ok]


def report(by_dir: dict[str, list[dict]], base: str, other: str, gap_est: str) -> str:
    lines = [
        "| SFT policy | estimator | runs | SFT holdout | validation | "
        "holdout, mean over seeds [95% t] | per-seed holdout |",
        "|---|---|---|---|---|---|---|",
    ]
    overlap = []
    for name, runs in by_dir.items():
        ivs = {}
        for est in (base, other):
            rs = sorted((r for r in runs if r["estimator"] == est), key=lambda r: r["seed"])
            if not rs:
                continue
            hold = [r["holdout"]["final"]["success"] for r in rs]
            val = statistics.mean(r["validation"]["final"]["success"] for r in rs)
            ivs[est] = seed_interval(hold) if len(hold) > 1 else (hold[0], math.nan, math.nan)
            m, lo, hi = ivs[est]
            lines.append(
                f"| {name} | {est} | {len(rs)} | {rs[0]['holdout']['sft']['success']:.3f} | "
                f"{val:.3f} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {' '.join(f'{h:.2f}' for h in hold)} |"
            )
        if len(ivs) == 2:
            (_, alo, ahi), (_, blo, bhi) = ivs[base], ivs[other]
            overlap.append(
                f"{name}: the across-seed intervals "
                f"{'overlap' if alo <= bhi and blo <= ahi else 'do not overlap'}"
            )
    lines += [
        "",
        "; ".join(overlap) + ".",
        "",
        f"| {other} − {base}, paired by (SFT policy, seed) | pairs | mean [95% t over pairs] | "
        "decision |",
        "|---|---|---|---|",
    ]
    policies = list(by_dir.values())
    for split in ("holdout", "validation"):
        diffs = paired_diffs(policies, base, policies, other, split)
        if len(diffs) < 2:
            lines.append(f"| {split} | {len(diffs)} | - | too few pairs |")
            continue
        verdict, m, lo, hi = decide(diffs)
        lines.append(
            f"| {split} | {len(diffs)} | {m:+.3f} [{lo:+.3f}, {hi:+.3f}] | interval {verdict} |"
        )
    # the mechanism, on the base arm's own batches
    run_gaps, run_r, xs, ys, skipped = [], [], [], [], 0
    for runs in by_dir.values():
        for r in runs:
            if r["estimator"] != base:
                continue
            g, s = gap_series(r, gap_est, base)
            if not g:
                skipped += 1
                continue
            run_gaps.append(statistics.mean(g))
            xs += s
            ys += g
            if not math.isnan(rr := pearson(s, g)):
                run_r.append(rr)
    lines += [
        "",
        f"Mechanism, on the {base} arm's own batches ({len(run_gaps)} runs, {len(xs)} updates"
        + (f"; {skipped} runs without paired records" if skipped else "")
        + "):",
        "",
    ]
    if len(run_gaps) >= 2:
        m, h = statistics.mean(run_gaps), paired_halfwidth(run_gaps)
        lines.append(
            f"1. same-batch alignment gap corr({gap_est}) − corr({base}): {m:+.3f} [{m - h:+.3f}, "
            f"{m + h:+.3f}] (mean of the runs' means, 95% t over runs)"
        )
    if len(run_r) >= 2:
        m, h = statistics.mean(run_r), paired_halfwidth(run_r)
        lines.append(f"2. correlation of that gap with the update's training success: pooled r = "
                     f"{pearson(xs, ys):+.3f} over {len(xs)} updates; per run, mean r = {m:+.3f} "
                     f"[{m - h:+.3f}, {m + h:+.3f}] (95% t over {len(run_r)} runs)")
    return "\n".join(lines)


def arms_table(
    arms: dict[str, tuple[str, list[list[dict]]]], base: str, base_runs: list[list[dict]]
) -> str:
    """More arms against `base`, each a name -> (estimator, the runs of each SFT policy in the
    positional directories' order): holdout over all its runs with the 95% t-interval, the
    difference to `base` paired by (SFT policy, seed), collapsed runs (`collapse_update`, or a
    final holdout of 0) and the diagnostics means. Exploratory: no decision is read here."""
    lines = [
        f"| arm | runs | holdout [95% t over runs] | − {base}, paired [95% t] (pairs) | "
        "collapsed | adv–optimal corr | invalid rate | entropy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (est, per_policy) in {base: (base, base_runs), **arms}.items():
        runs = [r for rs in per_policy for r in rs if r["estimator"] == est]
        if not runs:
            continue
        hold = [r["holdout"]["final"]["success"] for r in runs]
        m, lo, hi = seed_interval(hold) if len(hold) > 1 else (hold[0], math.nan, math.nan)
        d = paired_diffs(base_runs, base, per_policy, est)
        dm, dh = (statistics.mean(d), paired_halfwidth(d)) if len(d) > 1 else (math.nan, math.nan)
        fell = sum(
            collapse_update(r["curve"]) is not None or r["holdout"]["final"]["success"] == 0
            for r in runs
        )
        corr = _mean([_mean([u["corr"] for u in r["alignment"]]) for r in runs if r["alignment"]])
        diag = {
            k: _mean([_mean(r["diagnostics"][k]) for r in runs]) for k in ("invalid", "entropy")
        }
        paired = "-" if name == base else f"{dm:+.3f} [{dm - dh:+.3f}, {dm + dh:+.3f}] ({len(d)})"
        lines.append(
            f"| {name} | {len(runs)} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {paired} | {fell} | "
            f"{corr:+.3f} | {diag['invalid']:.3f} | {diag['entropy']:.3f} |"
        )
    return "\n".join(lines)


def plot(by_dir: dict[str, list[dict]], base: str, gap_est: str, path: Path) -> None:
    """Left: training success vs sampled episodes per (SFT policy, estimator), mean over seeds.
    Right: the same-batch gap against the update's training success, the base arm's updates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.6))
    fig.subplots_adjust(wspace=0.3)
    for name, runs in by_dir.items():
        for est in sorted({r["estimator"] for r in runs}):
            rs = [r for r in runs if r["estimator"] == est]
            n = min(len(r["curve"]) for r in rs)
            ys = np.array([r["curve"][:n] for r in rs], dtype=float)
            xs = rs[0]["episodes_per_update"] * np.arange(1, n + 1)
            ax.plot(xs, ys.mean(0), marker=".", label=f"{name} {est} ({len(rs)} seeds)")
        g = [gap_series(r, gap_est, base) for r in runs if r["estimator"] == base]
        bx.scatter(
            [s for _, ss in g for s in ss], [x for gg, _ in g for x in gg], s=8, alpha=0.6,
            label=name,
        )
    ax.set_xlabel("sampled episodes")
    ax.set_ylabel("training success")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    bx.axhline(0, color="k", lw=0.5)
    bx.set_xlabel(f"training success of the update ({base} runs)")
    bx.set_ylabel(f"corr({gap_est}) − corr({base})\n(same batch)")
    bx.legend(fontsize=6)
    bx.grid(alpha=0.3)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("dirs", nargs="+", help="long_credit.py OUT directories, one per SFT policy")
    ap.add_argument("--base", default="grpo")
    ap.add_argument("--other", default="gigpo")
    ap.add_argument(
        "--gap",
        default="gigpo γ=0.8",
        help="the same-batch score compared with --base's (long_credit.ALSO_SCORED)",
    )
    ap.add_argument(
        "--arms",
        default="{}",
        help='JSON name -> {"estimator": E, "dirs": [one OUT per SFT policy, in the '
        'positional order]}: '
        "more arms, compared with --base (exploratory)",
    )
    ap.add_argument("--figure", default="", help="write the curves and the gap scatter here (PNG)")
    args = ap.parse_args()
    # check every input before reading any result
    missing = [d for d in args.dirs if not (Path(d) / "results.jsonl").exists()]
    if missing:
        ap.error(
            f"no results.jsonl in {', '.join(missing)}: give long_credit.py --out directories that "
            "hold finished runs"
        )
    try:
        arms = json.loads(args.arms)
    except json.JSONDecodeError as e:
        ap.error(
            f'--arms is not JSON ({e}); e.g. \'{{"rloo": {{"estimator": "rloo", '
            f'"dirs": ["A", "B"]}}}}\''
        )
    bad = [
        n
        for n, a in arms.items()
        if not (
            isinstance(a, dict)
            and "estimator" in a
            and isinstance(a.get("dirs"), list)
            and len(a["dirs"]) == len(args.dirs)
        )
    ]
    if bad:
        ap.error(
            f'--arms {", ".join(bad)}: each needs "estimator" and "dirs", one '
            'directory per positional '
            f"directory ({len(args.dirs)}), in the same SFT-policy order"
        )
    by_dir = load(args.dirs)
    print(report(by_dir, args.base, args.other, args.gap))
    if arms:
        spec = {name: (a["estimator"], [read_runs(d) if (Path(d) / "results.jsonl").exists() else []
                                        for d in a["dirs"]]) for name, a in arms.items()}
        print("\n" + arms_table(spec, args.base, list(by_dir.values())))
    if args.figure:
        plot(by_dir, args.base, args.gap, Path(args.figure))


if __name__ == "__main__":
    main()
