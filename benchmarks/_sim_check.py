"""The simulator checked against the real pipeline (`benchmarks/async.py --check`).

1. Runs the real sync and async pipelines (`benchmarks/_async_real.py`: search-latency-v0,
   injected log-normal tool latency), or reads their run directories (``--from-runs DIR``,
   a ``--keep DIR`` of an earlier ``--real`` or ``--check``: DIR/sync-0, DIR/async-η).
2. Calibrates a `taurl.sim.Workload` from the SYNC run only (`taurl.sim.calibrate`: each
   field's source) and a short decode probe of `LocalEngine` on the run's policy and prompts
   (one torch thread, as the runs use).
3. Simulates sync and the same async schedule (η, interrupt) on that workload, for the
   real runs' number of updates, averaged over ``--sim-seeds`` workload seeds, and prints one
   JSON line per schedule: predicted vs measured trained_tokens_per_s, speedup_vs_sync,
   max_staleness, learner_idle_frac, and predicted / measured.

Measured, per real run: trained_tokens_per_s = Σ trained action tokens / RL wall s (as
``--real``); learner_idle_frac = 1 − Σ time/learn_s / RL wall s (the simulator's
definition: the learner is busy only in its steps). A third line is a diagnostic, not a
prediction: the async schedule simulated with the learner cost fitted on the ASYNC run
(its learner shares two cores with the engine), to show how much of the gap that explains.

Approximations (the simulator's model, not this harness): the async schedule's ``k``
over-provisioned groups are not modelled (the simulator's async admits by AReaL's rule
only; k = 2 of (η + 1)·8 groups); the engine's 64-row decode batch cap is not modelled
(a + b·n holds for any n); per-episode Python work (env step, template, ledger) is not
modelled apart from what the probe's steps include.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from taurl.errors import Error
from taurl.policy.factory import async_engine_rows
from taurl.sim import Schedule, Simulation, Workload, simulate
from taurl.sim.calibrate import DecodeProbe, SyncObservations, calibrate, fit_line

HERE = Path(__file__).parent


def _real() -> Any:
    spec = importlib.util.spec_from_file_location("_async_real", HERE / "_async_real.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- reading a run ------------------------------------------------------------------------

def read_run(run_dir: Path) -> dict[str, Any]:
    """config, RL metrics rows, RL wall seconds and RL episodes (the ledger's
    train split) of a run."""
    for name in ("config.yaml", "metrics.jsonl", "state.json", "ledger.sqlite"):
        if not (run_dir / name).exists():
            raise Error(
                f"{run_dir} has no {name}: not a finished run directory (run "
                "--real --keep DIR first)"
            )
    from taurl.recipe.sections import flatten

    # sections or flat: flat names
    cfg = flatten(yaml.safe_load((run_dir / "config.yaml").read_text()), warn=False)
    rows = [
        json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()
    ]
    rl = [r for r in rows if r.get("phase") == "rl"]
    db = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        records = [
            json.loads(r)
            for (r,) in db.execute(
                "SELECT record FROM trajectories WHERE split = 'train' ORDER BY seq"
            )
        ]
    finally:
        db.close()
    return {
        "cfg": cfg,
        "rl": rl,
        "rl_s": json.loads((run_dir / "state.json").read_text())["timings"]["rl"],
        "episodes": records,
    }


def observations(run: dict[str, Any]) -> SyncObservations:
    cfg, rl, eps = run["cfg"], run["rl"], run["episodes"]
    if not eps or not rl:
        raise Error("the sync run has no RL episodes or no RL metrics rows")
    seg_len = [[(s["kind"], len(s["token_ids"])) for s in e["segments"]] for e in eps]
    obs = [n for segs in seg_len for k, n in segs if k == "observation"]
    env = cfg.get("env_config", {})
    return SyncObservations(
        action_tokens=tuple(sum(n for k, n in segs if k == "action") for segs in seg_len),
        tool_calls=tuple(sum(1 for t in e["turns"] if t.get("receipt") is not None) for e in eps),
        prompt_tokens=float(
            np.mean([sum(n for k, n in segs if k == "prompt") for segs in seg_len])
        ),
        obs_tokens=float(np.mean(obs)) if obs else 0.0,
        learn_s=tuple(r["time/learn_s"] for r in rl),
        learn_tokens=tuple(r["rollout/episodes"] * r["rollout/tokens_mean"] for r in rl),
        sync_s=tuple(r["time/checkpoint_s"] for r in rl),
        tasks_per_batch=int(cfg["tasks_per_update"]),
        group_size=int(cfg["group_size"]),
        max_episode_tokens=int(cfg["max_episode_tokens"]),
        latency_mean_s=float(env.get("latency_mean_s", 0.0)),
        latency_sigma=float(env.get("latency_sigma", 1.0)),
        latency_max_s=float(env.get("latency_max_s", 5.0)),
    )


def measured(run: dict[str, Any]) -> dict[str, float]:
    """The real run's figures (module docstring), and its first batch's wait and steady state:
    first_batch_wait_s = the learner's wait for its first batch (async: update 1's
    time/learner_idle_s; sync: update 1's rollout); steady_* over updates 2.. (time/update_s);
    generated_tokens_per_s = action tokens of every stored RL episode (trained, dropped or
    waiting) / RL wall s — what the generator delivered."""
    rl, rl_s = run["rl"], run["rl_s"]

    def tokens(r: dict[str, Any]) -> float:
        return r.get(
            "rollout/trained_action_tokens",
            r["rollout/episodes"] * r.get("rollout/action_tokens_mean", 0.0),
        )

    steady_s = sum(r["time/update_s"] for r in rl[1:])
    generated = sum(
        sum(len(sg["token_ids"]) for sg in e["segments"] if sg["kind"] == "action")
        for e in run["episodes"]
    )
    return {
        "generated_tokens_per_s": generated / rl_s,
        "trained_tokens_per_s": sum(map(tokens, rl)) / rl_s,
        "max_staleness": max(r.get("rollout/staleness_max", 0.0) for r in rl),
        "learner_idle_frac": 1 - sum(r["time/learn_s"] for r in rl) / rl_s,
        "rl_wall_s": rl_s,
        "updates": len(rl),
        "first_batch_wait_s": rl[0].get("time/learner_idle_s", rl[0]["time/rollout_s"]),
        "steady_update_s": steady_s / max(len(rl) - 1, 1),
        "steady_trained_tokens_per_s": sum(map(tokens, rl[1:])) / steady_s if steady_s > 0 else 0.0,
    }


# --- the decode probe -----------------------------------------------------------------------

def probe_decode(
    policy_dir: str, prompts: list[list[int]], batches: tuple[int, ...] = (1, 8, 32, 64),
    max_tokens: int = 24,
) -> DecodeProbe:
    """Wall seconds per decode step of `LocalEngine` at each batch size (one torch thread),
    on real prompts; and a 64-row prefill's seconds per prompt token."""
    import torch

    from taurl.policy.engine import LocalEngine, SamplingParams
    from taurl.policy.model import load_policy

    torch.set_num_threads(1)
    model, tok = load_policy(policy_dir)
    engine = LocalEngine(model, tok, version=0, max_batch_size=max(batches), prefix_cache_tokens=0)

    async def run(n: int, k: int) -> tuple[float, int, int]:
        s0 = dict(engine.stats)
        t0 = time.perf_counter()
        await asyncio.gather(
            *(
                engine.generate(prompts[i % len(prompts)], SamplingParams(max_tokens=k, seed=i))
                for i in range(n)
            )
        )
        dt = time.perf_counter() - t0
        return (
            dt,
            engine.stats["steps"] - s0["steps"],
            engine.stats["batch_size_sum"] - s0["batch_size_sum"],
        )

    async def main() -> DecodeProbe:
        await run(8, 4)  # warm-up (first-call costs, the slim path's check)
        xs, ys = [], []
        for n in batches:
            dt, steps, rows = await run(n, max_tokens)
            if steps:
                xs.append(rows / steps)
                ys.append(dt / steps)
        dt, _, _ = await run(64, 1)
        prompt_tokens = sum(len(prompts[i % len(prompts)]) for i in range(64))
        return DecodeProbe(tuple(xs), tuple(ys), dt / prompt_tokens)

    try:
        return asyncio.run(main())
    finally:
        engine.close()


# --- the check ------------------------------------------------------------------------------

def predict(w: Workload, schedule: Schedule, updates: int, seeds: int) -> dict[str, float]:
    """The simulator's figures, averaged over `seeds`; the first batch's wait and the steady
    state from the same run stopped after one update (the events up to then are the same)."""
    sims = [Simulation(w, schedule, updates, seed=s) for s in range(seeds)]
    rs = [sim.run() for sim in sims]
    r1 = [simulate(w, schedule, updates=1, seed=s) for s in range(seeds)]
    dt = [r.sim_time_s - q.sim_time_s for r, q in zip(rs, r1, strict=True)]
    return {
        "trained_tokens_per_s": float(np.mean([r.trained_tokens_per_s for r in rs])),
        "max_staleness": float(max(r.max_staleness for r in rs)),
        "learner_idle_frac": float(np.mean([r.learner_idle_frac for r in rs])),
        "sim_time_s": float(np.mean([r.sim_time_s for r in rs])),
        "generated_tokens_per_s": float(
            np.mean([sim.dec.tokens / r.sim_time_s for sim, r in zip(sims, rs, strict=True)])
        ),
        "first_batch_wait_s": float(np.mean([q.learner_idle_frac * q.sim_time_s for q in r1])),
        "steady_update_s": float(np.mean(dt)) / max(updates - 1, 1),
        "steady_trained_tokens_per_s": float(
            np.mean(
                [
                    (r.trained_tokens - q.trained_tokens) / d
                    for r, q, d in zip(rs, r1, dt, strict=True)
                    if d > 0
                ]
            )
        ),
    }


def _ratio(p: float, m: float) -> float | None:
    return p / m if m else None


def compare_rows(schedules: list[tuple[str, Schedule, Workload, dict[str, float]]], updates: int,
                 seeds: int) -> list[dict[str, Any]]:
    """One row per (label, schedule, workload, measured); speedups against the first (sync)."""
    rows, base_p, base_m = [], None, None
    for label, sched, wl, meas in schedules:
        pred = predict(wl, sched, updates, seeds)
        base_p = base_p or pred["trained_tokens_per_s"]
        base_m = base_m or meas["trained_tokens_per_s"]
        pred["speedup_vs_sync"] = pred["trained_tokens_per_s"] / base_p
        meas = {**meas, "speedup_vs_sync": meas["trained_tokens_per_s"] / base_m}
        row: dict[str, Any] = {
            "mode": "check",
            "schedule": label,
            "eta": sched.bound,
            "interrupt": sched.interrupt,
        }
        for k in (
            "trained_tokens_per_s", "speedup_vs_sync", "max_staleness", "learner_idle_frac",
            "first_batch_wait_s", "steady_update_s", "steady_trained_tokens_per_s",
            "generated_tokens_per_s",
        ):
            row[f"predicted_{k}"], row[f"measured_{k}"] = pred[k], meas[k]
            row[f"ratio_{k}"] = _ratio(pred[k], meas[k])
        row.update({"decode_capacity_tokens_per_s_at_64": 64 / (wl.decode_a_s + 64 * wl.decode_b_s),
                    "predicted_time_s": pred["sim_time_s"], "measured_rl_wall_s": meas["rl_wall_s"],
                    "learn_fixed_s": wl.learn_fixed_s, "learn_s_per_token": wl.learn_s_per_token,
                    "updates": updates, "sim_seeds": seeds})
        rows.append(row)
    return rows


def run_check(args: Any) -> list[dict[str, Any]]:
    if len(args.etas) != 1:
        raise Error(
            f"--check compares sync with one async schedule: pass one --etas value, got {args.etas}"
        )
    if (
        not args.from_runs
        and args.keep
        and Path(args.keep).exists()
        and any(Path(args.keep).iterdir())
    ):
        raise Error(
            f"--keep {args.keep} is not empty: pass a new directory, or --from-runs {args.keep} "
            "to re-read the runs it holds"
        )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.from_runs or args.keep or tmp)
        if not args.from_runs:
            args.keep = str(root)
            args.no_sync = False
            _real().run_real(args)  # prints its rows (mode real) as each run ends
        eta = args.etas[0]
        sync, asy = read_run(root / "sync-0"), read_run(root / f"async-{eta}")
        acfg = asy["cfg"]
        prompts = [
            next(s["token_ids"] for s in e["segments"] if s["kind"] == "prompt")
            for e in sync["episodes"][:64]
        ]
        policy = sync["cfg"]["model"] if Path(sync["cfg"]["model"]).exists() else args.policy
        probe = probe_decode(policy, prompts)
        cal = calibrate(observations(sync), probe, max_concurrent=int(acfg["concurrency"]))
        print(
            json.dumps(
                {"mode": "calibration", **cal.as_dict(), "probe": dataclasses.asdict(probe)}
            ),
            flush=True,
        )
        w = cal.workload
        m_sync, m_async = measured(sync), measured(asy)
        updates = min(m_sync["updates"], m_async["updates"])
        # the engine's row cap of the async run (taurl.recipe.loop: one batch unless
        # engine_options set it)
        rows_cap = (acfg.get("engine_options") or {}).get("max_batch_size") or async_engine_rows(
            int(acfg["concurrency"]),
            int(acfg["tasks_per_update"]),
            int(acfg.get("overprovision", 0)),
            int(acfg["group_size"]),
        )
        sched = Schedule(
            "async", eta=int(acfg["staleness_eta"]), interrupt=acfg["interrupt"] == "interrupt",
            max_batch=int(rows_cap),
        )
        a_fixed, a_per = fit_line(
            [r["rollout/episodes"] * r["rollout/tokens_mean"] for r in asy["rl"]],
            [r["time/learn_s"] for r in asy["rl"]],
        )
        w_diag = dataclasses.replace(w, learn_fixed_s=a_fixed, learn_s_per_token=a_per)
        rows = compare_rows(
            [
                ("sync", Schedule("sync"), w, m_sync),
                (sched.label, sched, w, m_async),
                (
                    f"{sched.label}[learner cost of the async run: diagnostic]", sched, w_diag,
                    m_async,
                ),
            ],
            updates,
            args.sim_seeds,
        )
    for row in rows:
        print(
            json.dumps(
                {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in row.items()}
            ),
            flush=True,
        )
    return rows


def add_arguments(p: Any) -> None:
    """The real harness's options, plus this check's."""
    _real().add_arguments(p)
    p.add_argument(
        "--from-runs",
        default="",
        help="read DIR/sync-0 and DIR/async-<eta> instead of running them",
    )
    p.add_argument(
        "--sim-seeds", type=int, default=8, help="workload seeds the prediction averages over"
    )
    # the check's own defaults: a short run (about 2-3 minutes on 2 cores), one async schedule
    p.set_defaults(updates=4, etas=[4], latency_ms=1000.0, interrupt="interrupt")
