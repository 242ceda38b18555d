"""The learner's step on a GPU at SmolLM2-135M's shape: forward, backward and AdamW through
`taurl.train.rows.action_logprobs`, every token trained, fp32 and bf16 weights.

The weights are random (a model built from `--config`'s config.json): a CUDA machine reached
through a copy of the working tree cannot take the 98 MB GGUF, and the step's cost does not
depend on the weights' values. Timed with CUDA synchronisation, 3 warm-up steps, then 10.

    python benchmarks/gpu_learner.py --config ~/.cache/taurl/models/smollm2-135m-instruct

Prints one JSON line per (dtype, rows x width): seconds per step, trained tokens/s, the FLOP rate
counted as 6 x parameters per trained token, and the process's peak allocated GPU memory so far.
"""

from __future__ import annotations

import argparse
import json
import time


def step(model, rows, opt, action_logprobs) -> None:
    """One full fine-tuning step: mean log-likelihood of every trained token, backward, AdamW."""
    lp, _ = action_logprobs(model, rows)
    (-(lp * rows.mask).sum() / rows.mask.sum()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", required=True, help="a directory with the model's config.json")
    ap.add_argument(
        "--shapes", nargs="+", default=["8x256", "64x512"], help="rows x tokens per step"
    )
    ap.add_argument("--device", default="cuda", help="cpu: the code path only (gpu_check.py --dry)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    a = ap.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from taurl.train.rows import Rows, action_logprobs

    dev = a.device

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "no CUDA device here (torch.cuda.is_available() is False): run this on a GPU machine"
        )
    cfg = AutoConfig.from_pretrained(a.config)
    for dtype in (getattr(torch, d) for d in a.dtypes):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).to(dev, dtype)
        model.train()
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        for shape in a.shapes:
            n, w = map(int, shape.split("x"))
            ids = torch.randint(3, cfg.vocab_size, (n, w), device=dev)
            mask = torch.ones((n, w), device=dev)
            mask[:, 0] = 0  # the first token is given, not predicted
            zeros = torch.zeros((n, w), device=dev)
            rows = Rows(
                ids, torch.ones((n, w), dtype=torch.long, device=dev), mask, zeros, zeros.clone()
            )

            for _ in range(3):
                step(model, rows, opt, action_logprobs)
            sync()
            t, reps = time.perf_counter(), 10
            for _ in range(reps):
                step(model, rows, opt, action_logprobs)
            sync()
            s = (time.perf_counter() - t) / reps
            tokens = n * (w - 1)
            print(
                json.dumps(
                    {
                        "dtype": str(dtype).removeprefix("torch."),
                        "params": params,
                        "rows": n,
                        "width": w,
                        "step_s": round(s, 4),
                        "trained_tok_s": round(tokens / s),
                        "tflop_s": round(6 * params * tokens / s / 1e12, 1),
                        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                        if dev == "cuda"
                        else 0.0,
                    }
                ),
                flush=True,
            )
        del model, opt
        if dev == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
