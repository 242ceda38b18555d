"""The learner's trained tokens per CPU-second against this machine's limit, on a real model.

One full fine-tuning step (forward, backward, AdamW) through `taurl.train.rows.action_logprobs` on
`--rows` rows of `--tokens` tokens, every token trained, one torch thread, CPU time of this process
(so others' load counts less than in wall time). The limit: a step costs about 6 × parameters
FLOPs per trained token (forward 2, backward 4), so at most ``rate / (6 · params)`` tokens per
CPU-second, where ``rate`` is this core's measured fp32 matmul rate on the model's own shapes
(rows × hidden → intermediate, F.linear, the best of `--repeats`).

    .venv/bin/python benchmarks/learner_limit.py --model ~/.cache/taurl/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from taurl.policy.model import count_parameters, load_policy
    from taurl.train.rows import Rows, action_logprobs

    torch.set_num_threads(1)
    model, _ = load_policy(os.path.expanduser(args.model))
    model.train()
    params = count_parameters(model)
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    n, w = args.rows, args.tokens
    ids = torch.randint(3, cfg.vocab_size, (n, w), generator=g)
    ones = torch.ones((n, w))
    ones[:, 0] = 0  # the first token is given, not predicted
    rows = Rows(
        ids, torch.ones((n, w), dtype=torch.long), ones, torch.zeros((n, w)), torch.zeros((n, w))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step() -> None:
        lp, _ = action_logprobs(model, rows)
        (-(lp * rows.mask).sum() / rows.mask.sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def best(fn, repeats: int) -> float:
        out = []
        for _ in range(repeats):
            t = time.process_time()
            fn()
            out.append(time.process_time() - t)
        return min(out)

    step()  # AdamW allocates its moments
    step_cpu_s = best(step, args.repeats)
    trained = n * (w - 1)  # every position but the first predicts a token
    a = torch.randn((n * w, cfg.hidden_size), generator=g)
    wt = torch.randn((cfg.intermediate_size, cfg.hidden_size), generator=g)
    mm_s = best(lambda: [F.linear(a, wt) for _ in range(5)], args.repeats) / 5
    rate = 2 * a.shape[0] * a.shape[1] * wt.shape[0] / mm_s
    limit = rate / (6 * params)
    print(
        json.dumps(
            {
                "params": params,
                "trained_tokens": trained,
                "step_cpu_s": round(step_cpu_s, 2),
                "trained_tok_per_cpu_s": round(trained / step_cpu_s, 1),
                "matmul_gflop_s": round(rate / 1e9, 1),
                "limit_tok_per_cpu_s": round(limit, 1),
                "share_of_limit": round(trained / step_cpu_s / limit, 2),
                "load1": float(Path("/proc/loadavg").read_text().split()[0]),
            }
        )
    )


if __name__ == "__main__":
    main()
