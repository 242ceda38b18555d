"""taurl's synchronous GRPO step on the demo workload, timed (and optionally profiled).

One step is the body of `taurl.recipe.loop._rl_loop`, the same calls in the same order:
collect 8 tasks x 8 rollouts of the search env with the local engine (ledger writes
included), `Learner.update`, `save_checkpoint`, and the engine loading the new version.
The policy is the demo's SFT checkpoint (``RUN/checkpoints/v<sft_version>``), the tasks
the demo's RL task plan, the config the demo's own (``RUN/config.yaml``).

    python benchmarks/grpo_step.py --from runs/demo --steps 6             # seconds per step
    # cProfile of the rollouts, or of the learner's update
    python benchmarks/grpo_step.py --from runs/demo --steps 3 --profile rollout
    python benchmarks/grpo_step.py --from runs/demo --steps 3 --profile learn

Prints one JSON object: per-step seconds (step 1 is warm-up and excluded from the means),
rollout / learn / checkpoint seconds, and trained tokens per step (every token of every
row the learner trained on: prompt, actions and observations, as TRL counts its rows).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run_steps(src: Path, steps: int, threads: int, profile: str = "", learn_threads: int = 0,
              overrides: dict | None = None) -> dict:
    import torch

    from taurl import envs
    from taurl.data.ledger import Ledger
    from taurl.data.runs import RunDir
    from taurl.envs.tasks import plan_tasks
    from taurl.policy.engine import make_engine
    from taurl.policy.model import load_policy
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.sections import flat_options
    from taurl.recipe.validate import load_config
    from taurl.rollout.episodes import EpisodeSpec, LocalCollector
    from taurl.rollout.seeds import episode_seed
    from taurl.train.checkpoint import save_checkpoint
    from taurl.train.learner import Learner

    if threads:
        torch.set_num_threads(threads)
    cfg = load_config(TrainConfig, data={**json.loads(json.dumps(flat_options(load_config(
        TrainConfig, path=src / "config.yaml")))), **(overrides or {})})
    sft_version = json.loads((src / "state.json").read_text())["sft_version"]
    plan = plan_tasks(
        cfg.env, task_file=cfg.tasks, task_options=cfg.task_options,
        n_demos=cfg.demos if cfg.sft.data == "expert" else 0, n_rl=steps * cfg.tasks_per_update,
        n_eval=cfg.eval_tasks, seed=episode_seed(cfg.seed, "train"), eval_seed=cfg.eval_seed,
    )
    tmp = Path(tempfile.mkdtemp(prefix="taurl-step-"))
    try:
        run = RunDir(tmp / "run")
        (run.root / "checkpoints").mkdir(parents=True, exist_ok=True)
        shutil.copytree(src / "checkpoints" / f"v{sft_version}", run.checkpoint(sft_version))
        version = sft_version
        model, tok = load_policy(run.checkpoint(version))
        learner = Learner(model, cfg.learner_config(), pad_id=tok.pad_token_id)

        def make_env():
            env = envs.make(cfg.env, **cfg.env_kwargs())
            if cfg.system_prompt is not None:
                env.system_prompt = cfg.system_prompt
            return env

        engine = make_engine("local", run.checkpoint(version), tok, version=version,
                             max_batch_size=cfg.concurrency, seed=cfg.seed, **cfg.engine_options)
        collector = LocalCollector(
            engine, tok, make_env, cfg.rollout_config(), "bench", cfg.concurrency
        )
        ledger = Ledger(run.root / "ledger.sqlite")
        # CPU time, not wall: per-thread timers, so a loaded machine's waits do not count, and the
        # engine's worker thread (where decoding runs) gets its own profile, merged below
        prof = cProfile.Profile(time.thread_time) if profile else None
        worker_profs: list[cProfile.Profile] = []
        if profile == "rollout":
            serve = type(engine)._serve

            def profiled_serve(self):
                p = cProfile.Profile(time.thread_time)
                worker_profs.append(p)
                p.enable()
                try:
                    serve(self)
                finally:
                    p.disable()

            engine._serve = profiled_serve.__get__(engine)
        rows = []
        for update in range(1, steps + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            tasks = plan.rl[(update - 1) * cfg.tasks_per_update: update * cfg.tasks_per_update]
            specs = [
                EpisodeSpec(
                    f"r{update:04d}-{i:03d}-{g:02d}", t, episode_seed(cfg.seed, "rl", update, i, g),
                    f"r{update:04d}:{t.task_id}",
                )
                for i, t in enumerate(tasks)
                for g in range(cfg.group_size)
            ]
            on = prof is not None and update > 1
            if on and profile == "rollout":
                prof.enable()
            batch, _ = collector.collect(specs, ledger=ledger)
            if on and profile == "rollout":
                prof.disable()
            t1, c1 = time.perf_counter(), time.process_time()
            if learn_threads:
                torch.set_num_threads(learn_threads)
            if on and profile == "learn":
                prof.enable()
            stats = learner.update(batch)
            if on and profile == "learn":
                prof.disable()
            if learn_threads:
                torch.set_num_threads(threads or 1)
            t2, c2 = time.perf_counter(), time.process_time()
            version += 1
            save_checkpoint(run, version, model, tok, learner.optimizer, phase="rl", update=update)
            collector.load_weights(run.checkpoint(version), version)
            t3, c3 = time.perf_counter(), time.process_time()
            trained = sum(t.num_tokens for t in batch) if not stats.get("learn/skipped") else 0
            kept_tokens = stats.get("learn/tokens_per_s", 0.0) * stats.get("learn/learn_s", 0.0)
            rows.append(
                {
                    "step_s": t3 - t0,
                    "rollout_s": t1 - t0,
                    "learn_s": t2 - t1,
                    "checkpoint_s": t3 - t2,
                    "cpu_s": c3 - c0,
                    "rollout_cpu_s": c1 - c0,
                    "learn_cpu_s": c2 - c1,
                    "episodes": len(batch),
                    "trained_tokens": kept_tokens,
                    "batch_tokens": trained,
                    "sampled_tokens": sum(
                        len(s.token_ids) for t in batch for s in t.segments if s.kind == "action"
                    ),
                    "reward_mean": statistics.mean(t.reward for t in batch),
                }
            )
        ledger.close()
        collector.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    body = rows[1:] or rows
    out = {
        "side": "taurl",
        "threads": torch.get_num_threads(),
        "learn_threads": learn_threads or threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "steps": steps,
        "step_times_s": [round(r["step_s"], 3) for r in rows],
    }
    for k in (
        "step_s", "rollout_s", "learn_s", "checkpoint_s", "cpu_s", "rollout_cpu_s", "learn_cpu_s",
        "trained_tokens", "sampled_tokens", "batch_tokens",
    ):
        out[k] = round(statistics.mean(r[k] for r in body), 4)
    out["s_per_step"] = out.pop("step_s")
    out["trained_tokens_per_s"] = round(out["trained_tokens"] / out["s_per_step"], 1)
    out["reward"] = [round(r["reward_mean"], 3) for r in rows]
    if prof is not None:
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        for p in worker_profs:
            st.add(p)
        st.sort_stats("tottime").print_stats(35)
        s.write("\n--- cumulative ---\n")
        st.sort_stats("cumulative").print_stats(70)
        out["profile"] = s.getvalue()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--from", dest="src", default="runs/demo",
        help="a finished run (its SFT policy is the start)",
    )
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument(
        "--learn-threads", type=int, default=0,
        help="torch threads in the learner only (0: --threads)",
    )
    ap.add_argument("--profile", choices=["", "rollout", "learn"], default="")
    ap.add_argument(
        "--override",
        default="{}",
        help="JSON of config keys, e.g. '{\"micro_batch_tokens\": 2048}'",
    )
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    out = run_steps(
        Path(a.src), a.steps, a.threads, a.profile, a.learn_threads, json.loads(a.override)
    )
    prof = out.pop("profile", None)
    if prof:
        print(prof, file=sys.stderr)
    print(json.dumps(out), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
