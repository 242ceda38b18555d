"""Step-level credit on a long-horizon task: GRPO, RLOO, GiGPO, the graph estimator (SALT)
and PPO + GAE from one SFT policy, several seeds each, the same budget of sampled episodes.

    # the SFT policy
    taurl train --config configs/frozenlake8.yaml --rl.updates 1 --run-dir runs/fl8_sft
    python benchmarks/long_credit.py --from runs/fl8_sft --out runs/long_credit \
        --estimators grpo rloo gigpo salt gae --seeds 0 1 2 3 4 --updates 4 --jobs 2

Every run starts from the SAME SFT checkpoint (the `--from` run's version after SFT: one
SFT policy for all seeds and estimators) and keeps its config and task plan
(`estimators.sft_task_overlap` refuses a variant whose RL pool meets the demonstrations);
only the estimator and the RL seed (rollout sampling) change. Each (estimator, seed) is an
ordinary taurl run directory under OUT, run `--jobs` at a time in separate processes.

Besides the runs' own figures (validation and holdout success at the end, the
``rollout/*`` and ``learn/*`` metrics of every update), each run records how well the
advantages it trained on point at the optimal action — FrozenLake has an exact solver
(`taurl.envs.gym.solve.goal_distances`): an action is optimal at cell s when it moves to a
cell one step closer to G, d(s') = d(s) − 1. Per update, over every real turn of the batch
the learner credited (`Learner.assign`, wrapped here to observe, not to change):

* ``corr``: Pearson correlation of the turn's advantage with 1[the action was optimal];
* ``pos_subopt``: share of suboptimal turns (a detour, a wall bump, an invalid action, a
  step into a hole) that got a positive advantage — the "lucky detour" an outcome-level
  estimator rewards when the episode still reached G;
* ``neg_opt``: share of optimal turns that got a negative advantage.

Evaluation settings (eval_temperature, eval_trials, eval_tasks, eval_seed) may be overridden under
"all" in --overrides; the SFT policy is then evaluated once with them (by the first run) and
every run copies that evaluation, so the SFT row and the runs are measured alike.

Writes OUT/results.jsonl (one line per finished run, so a partial comparison survives),
OUT/curves.png (training success vs sampled episodes, mean ± std over seeds) and prints the
Markdown tables for BENCHMARKS.md and docs/experiments/. ``--report`` rebuilds them
from OUT/results.jsonl.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from taurl.errors import ConfigError
from taurl.eval.stats import cluster_wilson_interval, t_quantile
from taurl.recipe.config import TrainConfig
from taurl.recipe.sections import flat_options
from taurl.recipe.validate import load_config

DIAGNOSTICS = {
    "reward_std": "rollout/reward_std",
    "same_reward": "rollout/groups_same_reward",
    "entropy": "learn/entropy",
    "turns": "rollout/turns_mean",
    "invalid": "rollout/invalid_rate",
}


# -- the advantage probe (FrozenLake's exact solver) ----------------------------------------

def optimal_labels(traj: Any, task: Any, n_turns: int) -> np.ndarray:
    """1.0 where turn t's action was optimal at its cell (d(s') = d(s) − 1), else 0.0; NaN
    after a terminal move (none should follow). Deterministic (non-slippery) maps only."""
    from taurl.envs.gym.adapter import parse_action
    from taurl.envs.gym.frozenlake import ACTIONS, FrozenLake
    from taurl.envs.gym.solve import goal_distances

    P, s, is_success = FrozenLake().planning_model(task)
    d = goal_distances(P, is_success)
    out = np.full(n_turns, np.nan)
    for t, turn in enumerate(traj.turns[:n_turns]):
        parsed = parse_action(turn.action_text, ACTIONS)
        if parsed["kind"] != "move":
            out[t] = 0.0
            continue
        _, s2, _, terminated = P[s][parsed["id"]][0]
        out[t] = float(d.get(s2, math.inf) == d[s] - 1)
        s = s2
        if terminated:
            break
    return out


def alignment(adv: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """corr, pos_subopt, neg_opt of turn advantages `adv` against optimal-action `labels`
    (flat arrays of real turns; module docstring)."""
    ok = ~np.isnan(labels)
    a, y = adv[ok], labels[ok]
    out = {"turns": float(len(a)), "optimal_share": float(y.mean()) if len(y) else math.nan}
    out["corr"] = (
        float(np.corrcoef(a, y)[0, 1])
        if len(a) > 2 and a.std() > 0 and 0 < y.mean() < 1
        else math.nan
    )
    tol = 1e-9  # float round-off (γV*(s') − V*(s) of an optimal move is 0 up to ~1e-17) is no sign
    out["pos_subopt"] = float((a[y == 0] > tol).mean()) if (y == 0).any() else math.nan
    out["neg_opt"] = float((a[y == 1] < -tol).mean()) if (y == 1).any() else math.nan
    return out


def per_turn(trajs: list[Any], n_turns: list[int], width: int, fn: Any, fill: float) -> np.ndarray:
    """Stack `fn(traj, n)` (one value per real turn) into an (N, width) array,
    padded with `fill`."""
    return np.stack([np.pad(fn(tr, int(n)), (0, width - int(n)), constant_values=fill)
                     for tr, n in zip(trajs, n_turns, strict=True)])


def action_ids(traj: Any, n_turns: int) -> np.ndarray:
    """Turn t's move id (0–3), or −1 for an action that is not a move."""
    from taurl.envs.gym.adapter import parse_action
    from taurl.envs.gym.frozenlake import ACTIONS

    out = np.full(n_turns, -1, dtype=np.int64)
    for t, turn in enumerate(traj.turns[:n_turns]):
        parsed = parse_action(turn.action_text, ACTIONS)
        if parsed["kind"] == "move":
            out[t] = parsed["id"]
    return out


def anchor_stats(batch: Any, actions: np.ndarray) -> dict[str, float]:
    """What GiGPO's anchor groups (the (episode group, state) pairs) can tell apart, on one
    batch; `actions` (N, T) the move id of every turn (−1 pad or not a move):

    * ``anchor_shared``: share of real turns whose anchor group holds ≥ 2 turns;
    * ``anchor_contrast``: share of real turns whose anchor group holds ≥ 2 *different*
      actions — the only groups where comparing returns compares actions; where every visit
      took the same action, A^S measures the luck that came later;
    * ``step_nonzero``: share of real turns whose GiGPO step advantage A^S (Eq. 7) is not 0.
    """
    from taurl.credit.gigpo import anchor_groups, gigpo_components

    mask = batch.turn_mask
    ids, k = anchor_groups(batch.group, batch.state_hash, mask)
    turn_ids, acts = ids[mask], actions[mask]
    size = np.bincount(turn_ids, minlength=k)
    # distinct actions per group: count the distinct (group, action) pairs of each group
    pairs = np.unique(np.stack([turn_ids, acts]), axis=1)
    distinct = np.bincount(pairs[0], minlength=k)
    a_s = gigpo_components(batch)[1][mask]
    n = max(1, int(mask.sum()))
    return {"anchor_shared": float((size[turn_ids] >= 2).sum() / n),
            "anchor_contrast": float((distinct[turn_ids] >= 2).sum() / n),
            "step_nonzero": float((np.abs(a_s) > 1e-9).sum() / n)}


# Scored on every credited batch besides the run's own estimator: the same batch credited by
# each, so the alignment gap between estimators is paired within the batch the policy sampled.
ALSO_SCORED = {
    "grpo": ("grpo", {}),
    "gigpo": ("gigpo", {}),
    "gigpo ω=2": ("gigpo", {"omega": 2.0}),
    "gigpo γ=0.8": ("gigpo", {"gamma": 0.8}),
    "salt merge=state": ("salt", {"merge": "state"}),
}


def install_probe(tasks_by_id: dict[str, Any], sink: list[dict[str, Any]]) -> None:
    """Wrap `Learner.assign` so that each update's credited batch is scored (observe only):
    the run's own advantages (`alignment`), the anchor groups (`anchor_stats`), and the
    alignment of the ALSO_SCORED estimators' advantages on the same batch (``also``)."""
    from taurl.credit import compute_advantages
    from taurl.train import learner

    inner = learner.Learner.assign

    def assign(self, trajs):
        a = inner(self, trajs)
        if a is not None:
            mask = a.batch.turn_mask
            n, width = mask.sum(axis=1), mask.shape[1]
            labels = per_turn(
                a.trajs, n, width, lambda tr, k: optimal_labels(tr, tasks_by_id[tr.task_id], k),
                np.nan,
            )
            acts = per_turn(a.trajs, n, width, action_ids, -1)
            also = {
                name: alignment(
                    compute_advantages(a.batch, est, **opts).advantages[mask], labels[mask]
                )["corr"]
                for name, (est, opts) in ALSO_SCORED.items()
            }
            sink.append(
                {
                    **alignment(a.credit.advantages[mask], labels[mask]),
                    **anchor_stats(a.batch, acts),
                    "also": also,
                }
            )
        return a

    learner.Learner.assign = assign


def cell_values(traj: Any, task: Any, n_turns: int, gamma: float) -> tuple[np.ndarray, float]:
    """The exact critic: V*(s_t) = γ^(d(s_t) − 1) of the cell each turn acted in (the reward
    1 arrives on the move into G; 0 in a hole), and V* after the last turn."""
    from taurl.envs.gym.adapter import parse_action
    from taurl.envs.gym.frozenlake import ACTIONS, FrozenLake
    from taurl.envs.gym.solve import goal_distances

    P, s, is_success = FrozenLake().planning_model(task)
    d = goal_distances(P, is_success)

    def v(cell: int) -> float:
        return (
            0.0 if is_success(cell) or d.get(cell, math.inf) == math.inf else gamma ** (d[cell] - 1)
        )

    out = np.zeros(n_turns)
    for t, turn in enumerate(traj.turns[:n_turns]):
        out[t] = v(s)
        parsed = parse_action(turn.action_text, ACTIONS)
        if parsed["kind"] == "move":
            s = P[s][parsed["id"]][0][1]
    return out, v(s)


def scripted_probe(
    size: int = 8, maps: int = 24, group: int = 8, p_random: float = 0.15, max_turns: int = 20,
    seed: int = 0, gamma: float = 0.95,
) -> dict[str, dict[str, float]]:
    """Each estimator's `alignment` on the same batches of scripted episodes, no policy: per
    map, `group` episodes of the expert whose every move is a random suboptimal one with
    probability `p_random` (the SFT demonstrations' noise), played through the real loop.
    "gae V=0" is GAE with an untrained critic (= λ-returns of the outcome), "gae V*" with
    the exact one (`cell_values`): the range a learned critic moves in; with λ = 0 and V*
    the advantage is δ_t = γV*(s') − V*(s) = Q*(s, a) − V*(s) exactly (0 for an optimal move
    on a deterministic map, < 0 otherwise)."""
    import asyncio
    import dataclasses
    import random

    from taurl import envs
    from taurl.credit import TurnBatch, compute_advantages
    from taurl.credit.gigpo import gigpo_components
    from taurl.envs.gym import frozenlake_expert, frozenlake_tasks
    from taurl.policy import build_tokenizer
    from taurl.rollout.loop import RolloutConfig, run_episode
    from taurl.rollout.synth import ScriptedEngine

    tasks = frozenlake_tasks("train", maps, seed=seed, size=size)
    tok = build_tokenizer(
        [t.prompt for t in tasks]
        + [a for t in tasks for a in frozenlake_expert(t, random.Random(0))],
        vocab_size=400,
    )
    rc = RolloutConfig(
        max_turns=max_turns, max_action_tokens=16, max_episode_tokens=4096, max_context=8192
    )
    rng, trajs = random.Random(seed), []
    for gi, task in enumerate(tasks):
        for _ in range(group):
            engine = ScriptedEngine(
                tok, frozenlake_expert(task, rng, p_random=p_random), max_context=8192
            )
            tr = asyncio.run(
                run_episode(
                    engine, envs.make("frozenlake-v0", max_turns=max_turns), tok, task, seed=0,
                    config=rc,
                )
            )
            trajs.append(dataclasses.replace(tr, group_id=f"g{gi}"))
    by_id = {t.task_id: t for t in tasks}
    batch = TurnBatch.from_trajectories(trajs, max_turns=max_turns)
    mask = batch.turn_mask
    n = mask.sum(axis=1)
    labels = per_turn(
        trajs, n, max_turns, lambda tr, k: optimal_labels(tr, by_id[tr.task_id], k), np.nan
    )
    exact = [
        cell_values(tr, by_id[tr.task_id], int(k), gamma) for tr, k in zip(trajs, n, strict=True)
    ]
    v_star = np.stack([np.pad(v, (0, max_turns - len(v))) for v, _ in exact])
    with_v_star = batch.replace(values=v_star, bootstrap_values=np.array([b for _, b in exact]))
    runs = {
        "grpo": ("grpo", {}, batch),
        "rloo": ("rloo", {}, batch),
        "gigpo": ("gigpo", {}, batch),
        "gigpo ω=2": ("gigpo", {"omega": 2.0}, batch),
        "gigpo γ=0.8": ("gigpo", {"gamma": 0.8}, batch),
        "salt": ("salt", {}, batch),
        "salt merge=state": ("salt", {"merge": "state"}, batch),
        "gae V=0": (
            "gae",
            {"gamma": gamma},
            batch.replace(values=np.zeros_like(v_star), bootstrap_values=np.zeros(len(trajs))),
        ),
        "gae V*": ("gae", {"gamma": gamma}, with_v_star),
        "gae V*, λ=0": ("gae", {"gamma": gamma, "lam": 0.0}, with_v_star),
    }
    out = {
        "batch": {
            "episodes": float(len(trajs)),
            "success": float(batch.scores.mean()),
            "turns_mean": float(n.mean()),
            "optimal_share": float(np.nanmean(labels[mask])),
        }
    }
    for name, (est, opts, b) in runs.items():
        out[name] = alignment(compute_advantages(b, est, **opts).advantages[mask], labels[mask])
    # GiGPO's step part alone (A^S of Eq. 7, without the episode part A^E)
    out["gigpo A^S only"] = alignment(gigpo_components(batch)[1][mask], labels[mask])
    out["batch"].update(anchor_stats(batch, per_turn(trajs, n, max_turns, action_ids, -1)))
    return out


# -- one run (in a worker process) ------------------------------------------------------------

EVAL_KEYS = ("eval_tasks", "eval_trials", "eval_temperature", "eval_seed")


def run_one(src: str, out: str, est: str, options: dict, seed: int, updates: int,
            overrides: dict | None = None, sft_evals: str | None = None) -> dict[str, Any]:
    """One run from `src`'s SFT policy. When `overrides` change the evaluation settings, the
    SFT policy's evaluation is not `src`'s: it is `sft_evals`'s (a directory of
    ``{split}-sft.json`` made with the same settings), or, without one, the run's own."""
    import estimators as bench  # benchmarks/estimators.py (this script's directory is on sys.path)
    from taurl.recipe.loop import train

    src_p, run = Path(src), Path(out) / f"{est}-s{seed}"
    base = load_config(TrainConfig, path=src_p / "config.yaml")
    sft_version = json.loads((src_p / "state.json").read_text())["sft_version"]
    data = {**json.loads(json.dumps(flat_options(base))), "estimator": est,
            "estimator_options": options,
            "updates": updates, "rl_max_seconds": 0, "rl_seed": seed, **(overrides or {})}
    cfg = load_config(TrainConfig, data=data)
    same_evals = all(getattr(cfg, k) == getattr(base, k) for k in EVAL_KEYS)
    # else src's own, or none (below)
    shared = Path(sft_evals) if sft_evals and not same_evals else None
    bench.seed_run(
        src_p, run, sft_version, evals=shared, copy_evals=same_evals or shared is not None
    )
    if overlap := bench.sft_task_overlap(base, cfg):
        raise ConfigError(
            f"{est} seed {seed} would train on {len(overlap)} task(s) the SFT policy saw "
            f"(e.g. {overlap[0]!r})"
        )
    probe: list[dict[str, float]] = []
    if cfg.env == "frozenlake-v0" and not cfg.task_options.get("slippery"):
        install_probe({t.task_id: t for t in bench.task_plan(cfg).rl}, probe)
    t0 = time.perf_counter()
    summary = train(cfg, str(run), progress=False)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["phase"] == "rl"]
    return {
        "estimator": est,
        "seed": seed,
        "wall_s": time.perf_counter() - t0,
        "overrides": overrides or {},
        "lr": cfg.lr,
        "critic_warmup_updates": cfg.critic_warmup_updates,
        "episodes_per_update": cfg.tasks_per_update * cfg.group_size,
        "validation": summary["validation"],
        "holdout": summary["holdout"],
        "curve": [r.get("rollout/success", r.get("rollout/reward_mean")) for r in rows],
        "diagnostics": {k: [r.get(key) for r in rows] for k, key in DIAGNOSTICS.items()},
        "alignment": probe,
        "rows": [r.get("learn/rows") for r in rows],
    }


# -- the report ---------------------------------------------------------------------------------

def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.mean(xs) if xs else math.nan


def collapse_update(curve: list[float], tail: int = 3) -> int | None:
    """The 1-based update from which training success stays 0 to the end of the run, when
    that is at least `tail` updates (a collapse: every later group fails, so the outcome
    gives no signal that points back to success); None when the run never collapsed."""
    k = len(curve)
    while k > 0 and curve[k - 1] == 0:
        k -= 1
    return k + 1 if len(curve) - k >= tail else None


def seed_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval over seeds (each seed one number), clipped to [0, 1]."""
    m, h = statistics.mean(xs), paired_halfwidth(xs)
    if math.isnan(h):
        return m, math.nan, math.nan
    return m, max(0.0, m - h), min(1.0, m + h)


def paired_halfwidth(d: list[float]) -> float:
    """Half-width of the 95% t-interval of the mean of `d` — seeds' figures or their paired
    differences (NaN below 2 values)."""
    if len(d) < 2:
        return math.nan
    return t_quantile(len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))


def task_counts(runs: list[dict], split: str) -> dict[str, list[int]]:
    """Per evaluation task: [successes, episodes] summed over the runs' final evaluations."""
    per_task: dict[str, list[int]] = {}
    for r in runs:
        final = r[split]["final"]
        for task, k in final["task_successes"].items():
            per_task.setdefault(task, [0, 0])
            per_task[task][0] += k
            per_task[task][1] += final["trials"]
    return per_task


def pooled_interval(runs: list[dict], split: str) -> tuple[float, float, float]:
    """Success pooled over seeds with the task-clustered interval (`cluster_wilson_interval`):
    each task one cluster of seeds × trials episodes."""
    per_task = task_counts(runs, split)
    succ, sizes = [v[0] for v in per_task.values()], [v[1] for v in per_task.values()]
    lo, hi = cluster_wilson_interval(succ, sizes)
    return sum(succ) / max(1, sum(sizes)), lo, hi


def tables(results: list[dict]) -> str:
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["estimator"], []).append(r)
    sft = results[0]["holdout"]["sft"]["success"], results[0]["validation"]["sft"]["success"]
    lines = [
        f"SFT policy (all runs): validation {sft[1]:.3f}, holdout {sft[0]:.3f}",
        "",
        "| estimator | seeds | validation (choose) | holdout, mean over seeds [95% t-interval] | "
        "holdout pooled [task-clustered 95%] | per-seed holdout | collapsed runs (from update) | "
        "holdout of the runs that did not collapse [95% t] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for est, rs in by.items():
        val = seed_interval([r["validation"]["final"]["success"] for r in rs])
        hold = [r["holdout"]["final"]["success"] for r in rs]
        m, lo, hi = seed_interval(hold)
        p, plo, phi = pooled_interval(rs, "holdout")
        # collapsed: training success 0 for the last updates, or a final holdout of exactly 0
        # (a policy that broke at the last update has no zero tail yet)
        falls = [
            collapse_update(r["curve"]) or ("end" if h == 0 else None)
            for r, h in zip(rs, hold, strict=True)
        ]
        fell = ", ".join(
            f"s{r['seed']}@{u}" for r, u in zip(rs, falls, strict=True) if u is not None
        )
        alive = [h for h, u in zip(hold, falls, strict=True) if u is None]
        am, alo, ahi = seed_interval(alive) if alive else (math.nan, math.nan, math.nan)
        lines.append(
            f"| {est} | {len(rs)} | {val[0]:.3f} | {m:.3f} [{lo:.3f}, {hi:.3f}] | "
            f"{p:.3f} [{plo:.3f}, {phi:.3f}] | {' '.join(f'{h:.2f}' for h in hold)} | "
            f"{len(rs) - len(alive)} ({fell or '-'}) | {am:.3f} [{alo:.3f}, "
            f"{ahi:.3f}] ({len(alive)}) |"
        )
    base, *others = by
    if others:  # paired by seed: the same seed's runs share the task order and evaluation maps
        lines += ["", f"| estimator − {base} | seeds paired | holdout Δ, mean [95% t over seeds] | "
                  "validation Δ, mean [95% t over seeds] |", "|---|---|---|---|"]
        ref = {
            split: {r["seed"]: r[split]["final"]["success"] for r in by[base]}
            for split in ("holdout", "validation")
        }
        for est in others:
            cells = []
            for split in ("holdout", "validation"):
                d = [
                    r[split]["final"]["success"] - ref[split][r["seed"]]
                    for r in by[est]
                    if r["seed"] in ref[split]
                ]
                m, h = (statistics.mean(d), paired_halfwidth(d)) if d else (math.nan, math.nan)
                cells.append(f"{m:+.3f} [{m - h:+.3f}, {m + h:+.3f}]")
            lines.append(f"| {est} − {base} | {len(d)} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        "| estimator | reward std | identical-reward groups | entropy | turns | invalid rate | "
        "adv–optimal corr | suboptimal turns with A > 0 | optimal turns with A < 0 | "
        "wall s / run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for est, rs in by.items():
        d = {k: _mean([_mean(r["diagnostics"][k]) for r in rs]) for k in DIAGNOSTICS}
        al = {k: _mean([_mean([u.get(k, math.nan) for u in r["alignment"]]) for r in rs])
              for k in ("corr", "pos_subopt", "neg_opt")}
        lines.append(
            f"| {est} | {d['reward_std']:.3f} | {d['same_reward']:.3f} | {d['entropy']:.3f} | "
            f"{d['turns']:.1f} | {d['invalid']:.3f} | {al['corr']:+.3f} | {al['pos_subopt']:.3f} | "
            f"{al['neg_opt']:.3f} | {_mean([r['wall_s'] for r in rs]):.0f} |"
        )
    lines += ["", *anchor_table(by)]
    n = min(len(r["curve"]) for r in results)
    epu = results[0]["episodes_per_update"]
    lines += ["", "Training success (sampled episodes) vs episodes, mean over seeds:", "",
              "| estimator | " + " | ".join(str(epu * (i + 1)) for i in range(n)) + " |",
              "|---|" + "---|" * n]
    for est, rs in by.items():
        lines.append(
            f"| {est} | "
            + " | ".join(f"{_mean([r['curve'][i] for r in rs]):.3f}" for i in range(n))
            + " |"
        )
    return "\n".join(lines)


def anchor_table(by: dict[str, list[dict]]) -> list[str]:
    """The anchor diagnostics (`anchor_stats`) and the ALSO_SCORED alignments on each run's own
    batches, mean over updates and seeds; empty for results recorded before they existed."""
    rows = []
    for est, rs in by.items():
        ups = [u for r in rs for u in r["alignment"] if "also" in u]
        if not ups:
            continue
        m = {
            k: _mean([u[k] for u in ups])
            for k in ("anchor_shared", "anchor_contrast", "step_nonzero")
        }
        also = {k: _mean([u["also"][k] for u in ups]) for k in ALSO_SCORED}
        gap = _mean([u["also"]["gigpo"] - u["also"]["grpo"] for u in ups])
        rows.append(
            f"| {est} | {m['anchor_shared']:.3f} | {m['anchor_contrast']:.3f} | "
            f"{m['step_nonzero']:.3f} | "
            + " | ".join(f"{also[k]:+.3f}" for k in ALSO_SCORED)
            + f" | {gap:+.3f} |"
        )
    if not rows:
        return []
    return [
        "On each run's own batches (mean over updates and seeds): turns sharing an anchor state, "
        "turns whose anchor group took ≥ 2 different actions, turns with a non-zero GiGPO step "
        "advantage, and the adv–optimal corr of each estimator's advantages on the same batches:",
        "",
        "| run's estimator | anchor shared | anchor contrast | A^S ≠ 0 | "
        + " | ".join(f"corr {k}" for k in ALSO_SCORED)
        + " | gigpo − grpo, same batch |",
        "|---|---|---|---|" + "---|" * len(ALSO_SCORED) + "---|",
        *rows,
    ]


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["estimator"], []).append(r)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for est, rs in by.items():
        n = min(len(r["curve"]) for r in rs)
        ys = np.array([r["curve"][:n] for r in rs], dtype=float)
        xs = rs[0]["episodes_per_update"] * np.arange(1, n + 1)
        ax.plot(xs, ys.mean(0), marker="o", label=f"{est} ({len(rs)} seeds)")
        ax.fill_between(xs, ys.mean(0) - ys.std(0), ys.mean(0) + ys.std(0), alpha=0.15)
    ax.set_xlabel("sampled episodes")
    ax.set_ylabel("training success")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def _record(log: Path, r: dict[str, Any]) -> None:
    with log.open("a") as fh:
        fh.write(json.dumps(r) + "\n")
    print(
        f"{r['estimator']} seed {r['seed']}: validation {r['validation']['final']['success']:.3f} "
        f"holdout {r['holdout']['final']['success']:.3f} ({r['wall_s']:.0f} s)",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--from", dest="src", default="runs/fl8_sft", help="a run whose SFT policy is the start"
    )
    ap.add_argument("--out", default="runs/long_credit")
    ap.add_argument("--estimators", nargs="+", default=["grpo", "rloo", "gigpo", "salt", "gae"])
    ap.add_argument(
        "--options",
        default="{}",
        help='JSON estimator -> its options, e.g. \'{"gigpo": {"omega": 1}}\'',
    )
    ap.add_argument(
        "--overrides",
        default="{}",
        help='JSON estimator (or "all") -> TrainConfig fields, e.g. \'{"gae": {"lr": 0.003}}\'',
    )
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument(
        "--jobs", type=int, default=2,
        help="runs at once (separate processes, one torch thread each)",
    )
    ap.add_argument(
        "--report",
        action="store_true",
        help="only rebuild the tables and plot from OUT/results.jsonl",
    )
    ap.add_argument(
        "--probe", action="store_true", help="only the scripted probe (no policy): `scripted_probe`"
    )
    ap.add_argument(
        "--p-random", type=float, nargs="+", default=[0.15, 0.3],
        help="the probe's expert noise levels",
    )
    args = ap.parse_args()
    if args.probe:
        print("| episodes' p_random | estimator | adv–optimal corr | suboptimal turns with A > 0 | "
              "optimal turns with A < 0 |\n|---|---|---|---|---|")
        for p in args.p_random:
            res = scripted_probe(p_random=p)
            b = res.pop("batch")
            print(f"<!-- p_random {p}: anchor shared {b['anchor_shared']:.3f}, anchor contrast "
                  f"{b['anchor_contrast']:.3f}, A^S != 0 {b['step_nonzero']:.3f} -->")
            for name, a in res.items():
                print(
                    f"| {p} (success {b['success']:.2f}, {b['turns_mean']:.1f} turns, optimal "
                    f"moves {b['optimal_share']:.2f}) | {name} | {a['corr']:+.3f} | "
                    f"{a['pos_subopt']:.3f} | {a['neg_opt']:.3f} |"
                )
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "results.jsonl"
    if not args.report:
        options, overrides = json.loads(args.options), json.loads(args.overrides)
        done = (
            {(r["estimator"], r["seed"]) for r in map(json.loads, log.read_text().splitlines())}
            if log.exists()
            else set()
        )
        jobs = [(est, s) for s in args.seeds for est in args.estimators if (est, s) not in done]
        base = load_config(TrainConfig, path=Path(args.src) / "config.yaml")
        evals = {k: v for k, v in overrides.get("all", {}).items() if k in EVAL_KEYS}
        if any(k in EVAL_KEYS for est in args.estimators for k in overrides.get(est, {})):
            raise ConfigError(
                'evaluation settings (eval_*) go under "all": every run is compared '
                'on the same evaluation'
            )
        sft_evals = out / "sft-evals"  # the SFT policy evaluated once with the overridden settings
        if (
            jobs
            and any(getattr(base, k) != v for k, v in evals.items())
            and not (sft_evals / "holdout-sft.json").exists()
        ):
            # this run evaluates the SFT policy; the others copy it
            (est, s), jobs = jobs[0], jobs[1:]
            _record(log, run_one(args.src, args.out, est, options.get(est, {}), s, args.updates,
                                 {**overrides.get("all", {}), **overrides.get(est, {})}))
            sft_evals.mkdir(exist_ok=True)
            for split in ("validation", "holdout"):
                shutil.copy(out / f"{est}-s{s}" / "evals" / f"{split}-sft.json", sft_evals)
        with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            futs = {
                pool.submit(
                    run_one, args.src, args.out, est, options.get(est, {}), s, args.updates,
                    {**overrides.get("all", {}), **overrides.get(est, {})}, str(sft_evals),
                ): (est, s)
                for est, s in jobs
            }
            for f in cf.as_completed(futs):
                _record(log, f.result())
    results = [json.loads(x) for x in log.read_text().splitlines()]
    order = {e: i for i, e in enumerate(args.estimators)}
    results.sort(key=lambda r: (order.get(r["estimator"], 99), r["seed"]))
    plot(results, out / "curves.png")
    print(tables(results))


if __name__ == "__main__":
    main()
