"""The learner's update in fp32 vs bf16-mixed (and a bf16 engine), side by side.

One batch shaped as the demo's (8 tasks x 8 rollouts, ~40-token prompts, 20-90-token
actions) over the demo policy's shape (`--size tiny`, random weights; or `--model DIR`),
behaviour logprobs recorded by an "engine" copy of the same weights in the engine's dtype.
Each configuration trains a fresh copy of the same weights on the same batch; the
configurations run alternately, `--rounds` times, so machine load hits them alike. Reports,
per configuration: the median update seconds, the learn phase's peak RSS (VmHWM reset at its
start, `taurl.monitor.memory`), the loss, and the mismatch before/after truncated IS; and
fp32 with activation checkpointing.

    python benchmarks/mixed_precision.py [--size tiny] [--model DIR] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics

import torch

from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.monitor.memory import PeakRSS
from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import load_policy, tiny_config
from taurl.train.learner import Learner, LearnerConfig

# (name, learner weights dtype, train.precision, engine dtype, activation checkpointing): "all
# bf16" is `torch_dtype: bfloat16` alone (the whole model in bf16 on both sides)
CONFIGS = [("fp32 / engine fp32", torch.float32, "fp32", "float32", False),
           ("bf16-mixed / engine fp32", torch.float32, "bf16-mixed", "float32", False),
           ("bf16-mixed / engine bf16", torch.float32, "bf16-mixed", "bfloat16", False),
           ("fp32 / engine bf16", torch.float32, "fp32", "bfloat16", False),
           ("all bf16 (torch_dtype)", torch.bfloat16, "fp32", "bfloat16", False),
           ("fp32 + activation checkpointing", torch.float32, "fp32", "float32", True)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _batch(engine: torch.nn.Module, vocab: int, seed: int) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for task in range(8):
        prompt = [rng.randrange(2, vocab) for _ in range(40)]
        for g in range(8):
            action = [rng.randrange(2, vocab) for _ in range(rng.randint(20, 90))]
            with torch.no_grad():
                lp = sequence_logprobs(engine, prompt + action)[len(prompt):].float().tolist()
            segs = (Segment("prompt", tuple(prompt)),
                    Segment("action", tuple(action), tuple(lp), 0))
            out.append(Trajectory(
                episode_id=f"t{task}g{g}", run_id="bench", task_id=f"t{task}", group_id=f"t{task}",
                split="train", env_name="bench-v0", env_version="0", seed=g, segments=segs,
                turns=(Turn(0, "a", {"kind": "answer"}, "", 1, None, "eos"),),
                messages=({"role": "user", "content": "q"},), terminated=True, truncated=False,
                stop_reason=StopReason.ANSWERED, reward=float(rng.random() < 0.5)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="tiny", help="the default policy's size (random weights)")
    ap.add_argument("--model", default="", help="a local HF causal-LM directory instead")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.model:
        base = load_policy(args.model)[0]
    else:
        from transformers import Qwen2ForCausalLM

        base = Qwen2ForCausalLM(tiny_config(args.vocab, args.size)).eval()
    vocab = base.config.vocab_size
    batches = {d: _batch(copy.deepcopy(base).to(DTYPES[d]), vocab, args.seed) for d in DTYPES}
    peak = PeakRSS()
    res: dict[str, list[dict[str, float]]] = {c[0]: [] for c in CONFIGS}
    for _ in range(args.rounds):
        for name, weights, precision, engine, ckpt in CONFIGS:
            model = copy.deepcopy(base).to(weights)
            learner = Learner(model, LearnerConfig(lr=2.5e-4, precision=precision,
                                                   engine_dtype=engine,
                                                   activation_checkpointing=ckpt))
            peak.reset(release=True)
            stats = learner.update(batches[engine])
            res[name].append({**stats, "mem/learn_peak_rss_mb": peak.read_mb()})
    keys = ["learn/learn_s", "mem/learn_peak_rss_mb", "learn/loss", "mismatch/abs_mean",
            "mismatch/abs_max", "mismatch/tis_clipped_frac", "mismatch/tis_weight_mean",
            "mismatch/weight_gap_before", "mismatch/weight_gap_after"]
    table = {name: {k: statistics.median(r[k] for r in rows) for k in keys if k in rows[0]}
             for name, rows in res.items()}
    print(json.dumps({"rounds": args.rounds, "threads": args.threads,
                      "size": args.model or args.size,
                      "action_tokens": res[CONFIGS[0][0]][0]["learn/action_tokens"],
                      "median": table}, indent=1))


if __name__ == "__main__":
    main()
