"""2 learner ranks x 1 thread against 1 process x 2 threads: the same 2 cores, the same updates.

The demo's tiny policy (configs/demo.yaml: `policy.size: tiny`, 1,024-token vocabulary) and
an update of its size (8 tasks x 8 episodes of 24-110 tokens, rl.micro_batch_tokens 6144):
`Learner` with torch.set_num_threads(2), then with 1 thread (the baseline), then
`DistributedLearner` (ddp or fsdp, 2 gloo ranks, OMP_NUM_THREADS=1 each). One warm-up
update each, then `--updates` timed ones: the wall seconds per update as the recipe waits
for it (the ranks' version includes sending the batch and pulling the weights back) and the
learner's own `learn/learn_s`.

    OMP_NUM_THREADS=1 python benchmarks/dist_threads.py --strategy ddp --updates 10

Run it on an idle machine: on shared cores the figure is the other jobs' as much as ours.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_equivalence import batches  # noqa: E402  (this folder, put on sys.path above)


def timed(learner, data) -> dict[str, float]:
    """Median wall seconds and learn_s per update over `data[1:]` (data[0] warms up), and
    the mean micro-batches and trained tokens per update."""
    walls, learn, micro, tokens = [], [], [], []
    for i, batch in enumerate(data):
        t = time.perf_counter()
        stats = learner.update(batch)
        if i:
            walls.append(time.perf_counter() - t)
            learn.append(stats["learn/learn_s"])
            micro.append(stats["learn/micro_batches"])
            tokens.append(stats["learn/tokens_per_s"] * stats["learn/learn_s"])
    return {"wall_s": round(statistics.median(walls), 4),
            "learn_s": round(statistics.median(learn), 4), "micro_batches": statistics.mean(micro),
            "tokens": round(statistics.mean(tokens))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--out", help="also write the JSON line here (benchmarks/scale_model.py "
                    "--check reads it)")
    a = ap.parse_args()
    if os.environ.get("OMP_NUM_THREADS") != "1":
        raise SystemExit("run with OMP_NUM_THREADS=1: the ranks take their thread count from it")

    import copy

    from transformers import Qwen2ForCausalLM

    from taurl.policy.model import tiny_config
    from taurl.train.distributed.driver import DistributedLearner
    from taurl.train.learner import Learner, LearnerConfig

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_config(1024, "tiny", pad_token_id=0, bos_token_id=0,
                                         eos_token_id=1)).eval()
    data = batches(model, a.updates + 1, groups=8, rows=8, seed=0)
    config = LearnerConfig(lr=2.5e-4, micro_batch_tokens=6144)  # demo.yaml's rl section
    torch.set_num_threads(2)
    one = timed(Learner(copy.deepcopy(model), config), data)
    torch.set_num_threads(1)
    single = timed(Learner(copy.deepcopy(model), config), data)  # and 1 thread: the baseline
    ranked = DistributedLearner(copy.deepcopy(model), config, strategy=a.strategy, world_size=2)
    try:
        two = timed(ranked, data)
    finally:
        ranked.close()
    line = json.dumps({"params": sum(p.numel() for p in model.parameters()),
                       "strategy": a.strategy,
                       "updates": a.updates, "one_process_2_threads": one,
                       "one_process_1_thread": single,
                       "two_ranks_1_thread": two,
                       "load_avg": os.getloadavg()[0]})
    print(line, flush=True)
    if a.out:
        Path(a.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
