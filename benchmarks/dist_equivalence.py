"""N ranks (gloo) against one process on a real model: the same RL updates, side by side.

From the same weights and seed, `Learner` and `DistributedLearner` (world size 2, DDP or
FSDP2) take `--updates` GRPO updates on the same batches (random token ids in the model's
vocabulary, behaviour logprobs the model's own, 0/1 rewards within each group), cut into
micro-batches that the ranks share unevenly. Prints one JSON line per update (loss and grad
norm of both, their relative difference, seconds) and a summary: the largest relative
differences and the final weights' largest difference beside the lr. With ``--floor``, no
ranks: one process against itself with every update in ONE micro-batch instead, the fp32
rounding floor of the same figures (a sum of the same gradients in another order), and how
precise an fp32 gradient norm of the model is (against fp64; and its tensors cut in 2 shards).
``--dtype float64`` runs the model and AdamW in fp64 on both sides: rounding then sits near
1e-12 and a wrong split or normaliser would stand out by orders of magnitude.
(`taurl.train.distributed.equivalence` is the harness; tests/train/test_distributed_learner.py
runs it on the tiny policy.)

    OMP_NUM_THREADS=1 python benchmarks/dist_equivalence.py \\
        --model ~/.cache/taurl/models/smollm2-135m-instruct --strategy fsdp --updates 3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.policy.logprobs import sequence_logprobs
from taurl.train.distributed.equivalence import STEP_KEYS, run_pair
from taurl.train.learner import LearnerConfig


def trajectory(model, name: str, prompt: list[int], action: list[int], reward: float,
               group: str) -> Trajectory:
    """A one-turn episode whose behaviour logprobs are the model's own (on-policy)."""
    lp = sequence_logprobs(model, prompt + action)[len(prompt):].tolist()
    return Trajectory(
        episode_id=name, run_id="bench", task_id=group, group_id=group, split="train",
        env_name="random-v0", env_version="0", seed=0,
        segments=(Segment("prompt", tuple(prompt)), Segment("action", tuple(action), tuple(lp), 0)),
        turns=(Turn(0, "a", {"kind": "answer"}, "", 1, None, "eos"),),
        messages=({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}),
        terminated=True, truncated=False, stop_reason=StopReason.ANSWERED, reward=reward)


def batches(model, updates: int, groups: int, rows: int, seed: int) -> list[list[Trajectory]]:
    """`updates` batches of `groups` x `rows` episodes: prompts of 16-47 tokens, actions of
    8-63, ids drawn from the vocabulary past the first 16; reward 1 for one row per group."""
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size

    def ids(lo: int, hi: int) -> list[int]:
        n = int(torch.randint(lo, hi, (1,), generator=gen))
        return torch.randint(16, vocab, (n,), generator=gen).tolist()

    out = []
    for u in range(updates):
        batch = []
        for g in range(groups):
            prompt = ids(16, 48)
            for j in range(rows):
                batch.append(trajectory(model, f"u{u}-{g}-{j}", prompt, ids(8, 64),
                                        float(j == 0), f"g{u}-{g}"))
        out.append(batch)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path, help="an HF model directory")
    ap.add_argument("--strategy", choices=("ddp", "fsdp"), default="fsdp")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--rows", type=int, default=4, help="episodes per group")
    ap.add_argument("--lr", type=float, default=2e-5, help="configs/real.yaml's rl.lr")
    ap.add_argument("--micro-batch-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                    help="the model's and AdamW's dtype on both sides (float64: the rounding "
                         "far below 1e-5, so what remains is the split or the normaliser)")
    ap.add_argument("--floor", action="store_true",
                    help="one process, cut vs uncut micro-batches (no ranks): the rounding floor")
    a = ap.parse_args()

    from transformers import AutoModelForCausalLM

    torch.manual_seed(a.seed)
    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).eval()
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    data = batches(model, a.updates, a.groups, a.rows, a.seed)
    config = LearnerConfig(lr=a.lr, micro_batch_tokens=a.micro_batch_tokens)
    t0 = time.perf_counter()
    if a.floor:
        return floor(model, config, data, pad_id, t0)
    pair = run_pair(model, config, data, strategy=a.strategy, world_size=a.world_size,
                    pad_id=pad_id, lean=True)
    try:
        for u, (e, g) in enumerate(zip(pair.expect, pair.got, strict=True)):
            row = {"update": u + 1, "micro_batches": e["learn/micro_batches"],
                   "action_tokens": e["learn/action_tokens"]}
            for k in STEP_KEYS:
                name = k.removeprefix("learn/")
                row |= {f"{name}_1": e[k], f"{name}_{a.world_size}": g[k]}
            row |= {"s_1": round(pair.one_s[u], 2), f"s_{a.world_size}": round(pair.two_s[u], 2)}
            print(json.dumps(row), flush=True)
        print(json.dumps({
            "model": a.model.name, "strategy": a.strategy, "world_size": a.world_size,
            "dtype": a.dtype,
            "updates": a.updates, "lr": a.lr, "max_rel_diff": pair.relative(),
            "max_weight_diff": pair.weight_difference(),
            "wall_s": round(time.perf_counter() - t0, 1)}), flush=True)
    finally:
        pair.two.close()


def norm_precision(model, trajs: list[Trajectory]) -> dict[str, float]:
    """How precise an fp32 gradient norm of `model` is: the NLL gradient of `trajs`' token
    streams, its norm as `clip_grad_norm_` takes it (per tensor, then over tensors), the same
    with every tensor cut in 2 shards (FSDP2 on 2 ranks), against the fp64 sum of squares."""
    import copy

    m = copy.deepcopy(model)
    for t in trajs:
        ids = torch.tensor([[i for seg in t.segments for i in seg.token_ids]])
        m(ids, labels=ids).loss.backward()
    grads = [p.grad for p in m.parameters() if p.grad is not None]
    whole = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    halves = torch.stack([torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(c) for c in g.flatten().chunk(2)])) for g in grads])
    sharded = torch.linalg.vector_norm(halves)
    exact = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
    return {"whole_vs_fp64": abs(float(whole) - exact) / exact,
            "two_shards_vs_whole": abs(float(sharded) - float(whole)) / float(whole)}


def floor(model, config: LearnerConfig, data, pad_id: int, t0: float) -> None:
    """The single learner with `config`'s micro-batches against one micro-batch per update."""
    import copy
    import dataclasses

    from taurl.train.distributed.equivalence import max_weight_difference, relative_difference
    from taurl.train.learner import Learner

    whole = dataclasses.replace(config, micro_batch_tokens=1 << 20)
    cut, one = (Learner(copy.deepcopy(model), c, pad_id=pad_id) for c in (config, whole))
    rows = [(cut.update(b), one.update(b)) for b in data]
    print(json.dumps({
        "dtype": str(next(model.parameters()).dtype),
        "floor": "one process: micro-batches of "
                 f"{config.micro_batch_tokens} tokens vs one per update", "lr": config.lr,
        "micro_batches": [e["learn/micro_batches"] for e, _ in rows],
        "max_rel_diff": {k: max(relative_difference(e[k], g[k]) for e, g in rows)
                         for k in STEP_KEYS},
        "max_weight_diff": max_weight_difference(cut.model, one.model),
        "grad_norm_fp32_rel_error": norm_precision(model, data[0]),
        "wall_s": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
