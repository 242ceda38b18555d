"""CPU time of one decode step: the engine's slim path vs the model's own forward.

    python benchmarks/decode_step.py --from runs/demo            # the demo's SFT policy
    python benchmarks/decode_step.py --model-size small          # a fresh 'small' Qwen2

One decode step = one new token for each of B rows over a cache of W columns (the engine's
`BatchKV`), through `taurl.policy.slim_decode.SlimDecoder` or through ``model(...)`` as
`LocalEngine` calls it. CPU seconds of this thread (`time.thread_time`, so other processes'
load does not count), 40 steps per measurement, the two alternating, best of 3 rounds, one
torch thread. Prints one JSON object per (B, W).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def measure(model, rows: int, width: int, steps: int = 40, rounds: int = 3) -> dict:
    from taurl.policy.kv_cache import BatchKV
    from taurl.policy.slim_decode import SlimDecoder

    slim = SlimDecoder.for_model(model)
    if slim is None:
        raise SystemExit(f"{type(model).__name__} has no slim decode path")
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, width), generator=g)
    mask = torch.ones(rows, width, dtype=torch.long)
    kv = BatchKV.empty(mask, [width] * rows)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=mask.cumsum(1) - 1, use_cache=True,
              past_key_values=kv.cache)
    tok = torch.randint(3, vocab, (rows, 1), generator=g)
    best = {"forward": float("inf"), "slim": float("inf")}
    with torch.no_grad():
        for _ in range(rounds):
            for name in best:
                k = kv.clone()
                c0 = time.thread_time()
                for _ in range(steps):
                    pos = torch.tensor([[n] for n in k.lengths])
                    m = k.extend_mask()
                    if name == "slim":
                        slim(tok, pos[:, 0], m, k.cache)
                    else:
                        model(input_ids=tok, attention_mask=m, position_ids=pos, use_cache=True,
                              past_key_values=k.cache)
                    k.advance()
                best[name] = min(best[name], (time.thread_time() - c0) / steps)
    return {
        "rows": rows,
        "width": width,
        "forward_ms": round(best["forward"] * 1e3, 2),
        "slim_ms": round(best["slim"] * 1e3, 2),
        "speedup": round(best["forward"] / best["slim"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--from", dest="src", default="", help="a finished run: its SFT policy")
    ap.add_argument(
        "--model-size", default="tiny", help="without --from: a fresh policy of this preset"
    )
    ap.add_argument(
        "--shapes", default="4x80,16x120,64x150", help="rows x cache width, comma-separated"
    )
    a = ap.parse_args()
    torch.set_num_threads(1)
    from taurl.policy.model import create_policy, load_policy
    from taurl.policy.tokenizer import build_tokenizer

    if a.src:
        sft = json.loads((Path(a.src) / "state.json").read_text())["sft_version"]
        model = load_policy(Path(a.src) / "checkpoints" / f"v{sft}")[0]
    else:
        tok = build_tokenizer(
            [f"Town{i} lies in Country{i % 13}." for i in range(200)], vocab_size=1024
        )
        model = create_policy(tok, a.model_size, seed=0)
    model.eval()
    for shape in a.shapes.split(","):
        b, w = (int(x) for x in shape.split("x"))
        print(
            json.dumps(
                {"params": sum(p.numel() for p in model.parameters()), **measure(model, b, w)}
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
