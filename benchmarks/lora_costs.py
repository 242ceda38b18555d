"""What bf16, LoRA and chunked logprobs cost and give on this CPU, on a real model (docs/lora.md).

Three measurements on one model directory (e.g. the converted SmolLM2-135M-Instruct):

  bf16      logprob fidelity of a bf16 copy against fp32 on tokens the fp32 model sampled
            (max and mean |Δ log π| over the action tokens), and the time of a learner
            forward + backward on them in each dtype;
  step      one forward + backward + AdamW step on the same rows, full fine-tuning vs LoRA
            (rank 16, all linear layers), with the trained parameters and the bytes a
            checkpoint of each holds (weights + AdamW moments, or adapter + moments);
  merge     LoRA after 3 AdamW steps: merged vs unmerged logprobs (what the engine serves vs what
            the learner computes) and the size of an adapter checkpoint;
  logprobs  peak RSS above the start and seconds of the learner's token-logprob step on
            (K, V) logits, the plain fp32 log-softmax (what taurl did before) vs
            `taurl.train.token_logprobs` (each in a fresh process, so peaks are its own).

    .venv/bin/python benchmarks/lora_costs.py --model ~/.cache/taurl/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _rows(model, tok, n: int, tokens: int, seed: int):
    """`n` chat prompts, each followed by `tokens` tokens the model samples at T
    = 1 (the actions)."""
    import torch

    from taurl.train.rows import Rows

    prompts = [
        "In which country is the city of Gatesville?", "What is 12 + 7?", "Name a river in France.",
        "Who wrote Hamlet?", "What is the capital of Peru?", "Give a synonym of quick.",
        "How many legs has a spider?", "Which planet is largest?",
    ]
    seqs, masks = [], []
    for i in range(n):
        text = tok.apply_chat_template([{"role": "user", "content": prompts[i % len(prompts)]}],
                                       add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        torch.manual_seed(seed + i)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=tok.pad_token_id,
            )
        seqs.append(out[0].tolist())
        masks.append([0] * len(ids) + [1] * (len(seqs[-1]) - len(ids)))
    width = max(map(len, seqs))
    ids = torch.full((n, width), tok.pad_token_id)
    att, mask = torch.zeros((n, width), dtype=torch.long), torch.zeros((n, width))
    for i, (s, m) in enumerate(zip(seqs, masks, strict=True)):
        ids[i, : len(s)], att[i, : len(s)], mask[i, : len(s)] = (
            torch.tensor(s),
            1,
            torch.tensor(m, dtype=torch.float),
        )
    return Rows(ids, att, mask, torch.zeros((n, width)), torch.zeros((n, width)))


def _best(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def bf16(args) -> dict:
    import copy

    import torch

    from taurl.policy.model import load_policy
    from taurl.train.rows import action_logprobs

    model, tok = load_policy(args.model)
    rows = _rows(model, tok, args.rows, args.tokens, args.seed)
    half = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        lp32, _ = action_logprobs(model, rows)
        lp16, _ = action_logprobs(half, rows)
    m = rows.mask.bool()
    diff = (lp16 - lp32)[m].abs()
    out = {
        "action_tokens": int(m.sum()),
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "p99_abs_diff": float(diff.quantile(0.99)),
    }
    for name, mdl in (("fp32", model), ("bf16", half)):
        def step(mdl=mdl):
            lp, _ = action_logprobs(mdl, rows)
            (lp * rows.mask).sum().backward()
            mdl.zero_grad(set_to_none=True)
        out[f"{name}_fwd_bwd_s"] = _best(step, args.repeats)
    return out


def step(args) -> dict:
    import torch

    from taurl.policy.model import load_policy
    from taurl.train import lora
    from taurl.train.rows import action_logprobs

    out = {}
    for kind in ("full", "lora"):
        model, tok = load_policy(args.model)
        rows = _rows(model, tok, args.rows, args.tokens, args.seed)
        if kind == "lora":
            model = lora.attach(model, lora.LoraOptions(rank=16, alpha=32.0), seed=0)
        params = lora.trainable(model)
        opt = torch.optim.AdamW(params, lr=1e-5)

        def one(model=model, opt=opt, rows=rows):
            lp, _ = action_logprobs(model, rows)
            (-(lp * rows.mask).sum() / rows.mask.sum()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        out[f"{kind}_step_s"] = _best(one, args.repeats)
        n = sum(p.numel() for p in params)
        out[f"{kind}_trained_params"] = n
        # a checkpoint: the trained weights (LoRA: the adapter; full: every weight) +
        # 2 AdamW moments, fp32
        weights = n if kind == "lora" else sum(p.numel() for p in model.parameters())
        out[f"{kind}_checkpoint_mb"] = round((weights + 2 * n) * 4 / 2**20, 1)
        del model, opt
    return out


def merge(args) -> dict:
    """LoRA trained a few steps (B != 0): merged vs unmerged logprobs, and the adapter
    checkpoint's size."""
    import copy
    import tempfile
    from pathlib import Path

    import torch

    from taurl.policy.files import save_policy
    from taurl.policy.model import load_policy
    from taurl.train import lora
    from taurl.train.rows import action_logprobs

    model, tok = load_policy(args.model)
    rows = _rows(model, tok, args.rows, args.tokens, args.seed)
    peft = lora.attach(model, lora.LoraOptions(rank=16, alpha=32.0), seed=0)
    opt = torch.optim.AdamW(lora.trainable(peft), lr=1e-3)
    for _ in range(3):
        lp, _ = action_logprobs(peft, rows)
        (-(lp * rows.mask).sum() / rows.mask.sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    peft.eval()
    with torch.no_grad():
        unmerged, _ = action_logprobs(peft, rows)
        with lora.base_only(peft):
            base, _ = action_logprobs(peft, rows)
        merged, _ = action_logprobs(copy.deepcopy(peft).merge_and_unload(), rows)
    m = rows.mask.bool()
    with tempfile.TemporaryDirectory() as tmp:
        save_policy(peft, tok, Path(tmp) / "ckpt")
        size = sum(f.stat().st_size for f in (Path(tmp) / "ckpt").iterdir())
        adapter = (Path(tmp) / "ckpt" / "adapter_model.safetensors").stat().st_size
    return {
        "merged_vs_unmerged_max_abs": float((merged - unmerged)[m].abs().max()),
        "adapter_vs_base_max_abs": float((unmerged - base)[m].abs().max()),
        "adapter_checkpoint_mb": round(size / 2**20, 1),
        "adapter_file_mb": round(adapter / 2**20, 1),
    }


def logprobs_child(mode: str, k: int, v: int) -> dict:
    import torch

    from taurl.monitor.memory import PeakRSS, current_rss_mb
    from taurl.train.token_logprobs import gathered_logprobs

    torch.manual_seed(0)
    x = (torch.randn(k, v) * 3).requires_grad_(True)
    y = torch.randint(0, v, (k,))
    peak, start = PeakRSS(), current_rss_mb()
    peak.reset()
    t = time.perf_counter()
    if mode == "plain":  # the learner's code before taurl.train.token_logprobs
        logp = torch.log_softmax(x.float() / 0.7, dim=-1)
        lp = logp.gather(-1, y[:, None]).squeeze(-1)
        _ = -(logp.exp() * logp).sum(-1)
    else:
        lp, _ = gathered_logprobs(x, y, 0.7, entropy=True)
    lp.sum().backward()
    return {"s": time.perf_counter() - t, "peak_above_start_mb": peak.read_mb() - start}


def logprobs(args) -> dict:
    out = {}
    for mode in ("plain", "chunked"):
        runs = [
            json.loads(
                subprocess.run(
                    [sys.executable, __file__, "--child", mode, "--k", str(args.k)],
                    check=True,
                    capture_output=True,
                    text=True,
                    env={**os.environ, "OMP_NUM_THREADS": str(args.threads)},
                ).stdout.splitlines()[-1]
            )
            for _ in range(args.repeats)
        ]
        out[mode] = {"s_best": min(r["s"] for r in runs), "s_worst": max(r["s"] for r in runs),
                     "peak_above_start_mb": max(r["peak_above_start_mb"] for r in runs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="an HF model directory")
    ap.add_argument("--parts", nargs="+", default=["bf16", "step", "merge", "logprobs"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64, help="sampled (action) tokens per row")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (the recipe's default is 1)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--k", type=int, default=2048, help="logprobs: action positions (rows of logits)"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(logprobs_child(args.child, args.k, 49152)))
        return
    import torch

    torch.set_num_threads(args.threads)
    result = {"threads": args.threads, "model": args.model}
    for part in args.parts:
        result[part] = {"bf16": bf16, "step": step, "merge": merge, "logprobs": logprobs}[part](
            args
        )
        print(json.dumps({part: result[part]}), flush=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
