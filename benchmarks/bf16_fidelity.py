"""bfloat16 vs float32 logprobs of the same sampled tokens (`torch_dtype: bfloat16`).

A bf16 run records bf16 behaviour logprobs and trains on bf16 logprobs; this measures how far
they are from the float32 ones of the same model on the same tokens: |Δ log π| per sampled
token, and the importance-ratio noise |1 − exp(Δ)| it would add if the two were mixed.

    python benchmarks/bf16_fidelity.py --model DIR [--prompts 16] [--tokens 64] [--seed 0] \
        [--engine]
"""

from __future__ import annotations

import argparse

import torch

from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import load_policy

PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Write a Python function that reverses a list.",
    "What is the capital of France? Answer briefly.",
    "List three prime numbers and say why they are prime.",
    "Summarize the plot of a detective story in one paragraph.",
    "How do you boil an egg?",
    "Translate 'good morning' into Spanish and German.",
    "What does a compiler do?",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a local HF causal-LM directory")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64, help="sampled tokens per prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--engine",
        action="store_true",
        help="also: the bf16 engine's recorded logprobs vs the bf16 learner",
    )
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    fp32, tok = load_policy(args.model)
    bf16 = load_policy(args.model, dtype=torch.bfloat16)[0]
    diffs = []
    for i in range(args.prompts):
        ids = tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                      add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        out = fp32.generate(ids, do_sample=True, temperature=1.0, max_new_tokens=args.tokens,
                            pad_token_id=tok.pad_token_id)[0].tolist()
        start = ids.shape[1]
        a = sequence_logprobs(fp32, out)[start:]
        b = sequence_logprobs(bf16, out)[start:].float()
        diffs.append((a - b).abs())
    d = torch.cat(diffs)
    print(
        f"{args.model}: {d.numel()} sampled tokens; bf16 vs fp32 |Δ log π| mean {d.mean():.4f}, "
        f"p95 {d.quantile(0.95):.4f}, max {d.max():.4f}; |1 − exp(Δ)| "
        f"mean {(1 - torch.exp(-d)).mean():.4f}"
    )
    if args.engine:
        engine_vs_learner(bf16, tok, args)


def engine_vs_learner(model: torch.nn.Module, tok, args) -> None:
    """A bf16 run's own mismatch: the behaviour logprobs the bf16 LocalEngine records (batched,
    incremental decoding) against the bf16 learner's full forward of the same tokens."""
    import asyncio

    from taurl.policy.local_engine import LocalEngine
    from taurl.policy.protocol import SamplingParams

    engine = LocalEngine(model, tok, version=0, seed=args.seed)
    prompts = []
    for i in range(args.prompts):
        ids = tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                      add_generation_prompt=True, return_tensors="pt")
        prompts.append((ids if isinstance(ids, torch.Tensor) else ids["input_ids"])[0].tolist())

    async def sample():
        return await asyncio.gather(
            *(
                engine.generate(p, SamplingParams(temperature=1.0, max_tokens=args.tokens, seed=i))
                for i, p in enumerate(prompts)
            )
        )

    try:
        gens = asyncio.run(sample())
    finally:
        engine.close()
    d = torch.cat(
        [
            (
                sequence_logprobs(model, p + g.token_ids)[len(p) :].float()
                - torch.tensor(g.logprobs)
            ).abs()
            for p, g in zip(prompts, gens, strict=True)
            if g.token_ids
        ]
    )
    print(
        f"bf16 engine (recorded) vs bf16 learner: {d.numel()} tokens; |Δ log π| "
        f"mean {d.mean():.4f}, p95 {d.quantile(0.95):.4f}, max {d.max():.4f}; |1 − exp(Δ)| "
        f"mean {(1 - torch.exp(-d)).mean():.4f}"
    )


if __name__ == "__main__":
    main()
