"""The scale model's table: predicted step time and best placement for 8 and 64 GPUs, 0.5B-8B.

`taurl.sim.placement.best` over every placement (colocated; split, synchronous; split with
the engines one version ahead) with the costs of `taurl.sim.scale` and the assumptions of
`taurl.sim.presets` (docs/scale-out.md lists them beside what was measured). `--mfu`
replaces the assumed learner MFU (0.35), e.g. by the one measured at 135M on an H200 (0.073).

`--check OUT.json` puts the model beside measured points on this machine: the learner's
per-token cost from `benchmarks/dist_threads.py`'s 1-process update (its JSON line in
OUT.json), a gloo all-reduce's bandwidth measured here (2 processes, `--gloo-mb` MB), and
from them the 2-rank update predicted beside the one dist_threads.py measured.

    python benchmarks/scale_model.py                         # the table, the assumed MFU
    python benchmarks/scale_model.py --mfu 0.073             # with the measured one
    OMP_NUM_THREADS=1 python benchmarks/dist_threads.py --strategy ddp --updates 10 --out dt.json
    OMP_NUM_THREADS=1 python benchmarks/scale_model.py --check dt.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

from taurl.sim.placement import KINDS, best
from taurl.sim.presets import DEFAULT_STEP, H100, MEASURED_H200_MFU, MODELS
from taurl.sim.scale import achieved_flops, ring_bytes


def table(gpus: list[int], mfu: float, episodes: int, prompt: int, generated: int) -> list[dict]:
    """One row per (GPUs, model): the best placement of each kind and the overall best."""
    hw = dataclasses.replace(H100, learner_mfu=mfu)
    wl = dataclasses.replace(DEFAULT_STEP, episodes=episodes, prompt_tokens=prompt,
                             generated_tokens=generated)
    rows = []
    for g in gpus:
        for name, model in MODELS.items():
            row: dict = {"gpus": g, "model": name}
            for kind in KINDS:
                p = best(model, wl, hw, g, kind)
                row[kind] = None if p is None else {
                    "step_s": round(p.step_s, 2), "placement": p.label(),
                    "generation_s": round(p.generation_s, 2), "learner_s": round(p.learner_s, 2),
                    "collective_s": round(p.collective_s, 2), "sync_s": round(p.sync_s, 2)}
            top = best(model, wl, hw, g)
            row["best"] = None if top is None else top.kind
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    """The table as docs/scale-out.md shows it."""
    out = ["| GPUs | model | colocated | split (sync) | split-async (η = 1) | best |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r[k]['step_s']} s: {r[k]['placement']}" if r[k] else "does not fit"
                 for k in KINDS]
        out.append(f"| {r['gpus']} | {r['model']} | " + " | ".join(cells) + f" | {r['best']} |")
    return "\n".join(out)


def _gloo_worker(rank: int, world: int, port: int, mb: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.ones(mb * 2**20 // 4)
    dist.all_reduce(x)  # warm-up
    times = []
    for _ in range(5):
        t = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t)
    if rank == 0:
        res = {"median_s": statistics.median(times), "bytes": x.numel() * 4}
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def gloo_bus_bytes_per_s(mb: int) -> float:
    """A 2-process gloo all-reduce of `mb` MB here: ring bytes per rank / median seconds."""
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "gloo.json")
        mp.spawn(_gloo_worker, args=(2, port, mb, out), nprocs=2)
        res = json.loads(Path(out).read_text())
    return ring_bytes("all_reduce", 2, res["bytes"]) / res["median_s"]


def check(dist_threads_json: str, gloo_mb: int) -> dict:
    """The model beside `benchmarks/dist_threads.py`'s measured update (same batches on 1
    process × 1 thread and on 2 ranks × 1 thread): the achieved FLOP/s of the 1-process
    update (6 · N · tokens / learn_s), and from it and a gloo all-reduce's bandwidth measured
    here the 2-rank update predicted (half the compute + one all-reduce of fp32 gradients)."""
    m = json.loads(Path(dist_threads_json).read_text().strip().splitlines()[-1])
    params, one, two = m["params"], m["one_process_1_thread"], m["two_ranks_1_thread"]
    flops = achieved_flops(params, one["tokens"], one["learn_s"])
    bw = gloo_bus_bytes_per_s(gloo_mb)
    comm = ring_bytes("all_reduce", 2, 4.0 * params) / bw
    predicted = 6 * params * two["tokens"] / flops / 2 + comm
    return {"params": params, "tokens_per_update": one["tokens"],
            "achieved_gflops_1_process": round(flops / 1e9, 3),
            "gloo_bus_GBps": round(bw / 1e9, 3), "allreduce_s": round(comm, 5),
            "measured_1_process_learn_s": one["learn_s"],
            "predicted_2_ranks_learn_s": round(predicted, 4),
            "measured_2_ranks_learn_s": two["learn_s"],
            "measured_load_avg": m.get("load_avg"), "check_load_avg": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--mfu", type=float, default=H100.learner_mfu,
                    help=f"learner MFU (assumed {H100.learner_mfu}; measured at 135M on an "
                         f"H200: {MEASURED_H200_MFU:.3f})")
    ap.add_argument("--episodes", type=int, default=DEFAULT_STEP.episodes)
    ap.add_argument("--prompt-tokens", type=int, default=DEFAULT_STEP.prompt_tokens)
    ap.add_argument("--generated-tokens", type=int, default=DEFAULT_STEP.generated_tokens)
    ap.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    ap.add_argument("--check", metavar="DIST_THREADS_JSON",
                    help="benchmarks/dist_threads.py's output: predicted vs measured 2 ranks")
    ap.add_argument("--gloo-mb", type=int, default=16, help="--check: all-reduce size, MB")
    a = ap.parse_args()
    if a.check:
        print(json.dumps(check(a.check, a.gloo_mb), indent=1))
        return
    rows = table(a.gpus, a.mfu, a.episodes, a.prompt_tokens, a.generated_tokens)
    print(json.dumps(rows, indent=1) if a.json else markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
