"""How many torch CPU threads (and which OpenMP wait policy) suit a policy of a given size?

Each setting runs in its own process, since OpenMP reads OMP_WAIT_POLICY once, at start.
For each it measures SFT-like training steps/s (batch 16 x 70 tokens, AdamW) and batched
decode forwards/s (64 rows x 1 token), on an idle machine and, with --busy, while a second
process keeps one core busy (what a shared CI machine or a parallel job does).

    .venv/bin/python benchmarks/threads.py                # tiny policy
    .venv/bin/python benchmarks/threads.py --size small --busy
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

SETTINGS = [  # (threads, OMP_WAIT_POLICY)
    (1, "PASSIVE"),
    (2, "PASSIVE"),
    (2, "ACTIVE"),
]


def measure(size: str, seconds: float) -> dict[str, float]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from taurl.policy.model import SIZES

    s = SIZES[size]
    cfg = Qwen2Config(
        vocab_size=1024,
        hidden_size=s.hidden_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        intermediate_size=s.intermediate_size,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (16, 70))

    def train_step() -> None:
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()

    def rate(fn) -> float:
        for _ in range(3):
            fn()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
            n += 1
        return n / (time.perf_counter() - t0)

    train = rate(train_step)
    model.eval()
    xs = torch.randint(0, cfg.vocab_size, (64, 1))
    with torch.no_grad():
        decode = rate(lambda: model(input_ids=xs))
    return {"train_steps_per_s": train, "decode_forwards_per_s": decode}


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size", default="tiny", help="policy preset (taurl.policy.model.SIZES)")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds per measurement")
    p.add_argument(
        "--busy",
        action="store_true",
        help="also measure with one core kept busy by another process",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(int(args.child))
        print(json.dumps(measure(args.size, args.seconds)))
        return
    rows = []
    for busy in ([False, True] if args.busy else [False]):
        stop = mp.Event()
        spinner = mp.Process(target=_spin, args=(stop,)) if busy else None
        if spinner:
            spinner.start()
        for threads, policy in SETTINGS:
            env = {**os.environ, "OMP_WAIT_POLICY": policy}
            out = subprocess.run(
                [
                    sys.executable, __file__, "--size", args.size, "--seconds", str(args.seconds),
                    "--child", str(threads),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append((busy, threads, policy, r))
            print(
                f"{'busy' if busy else 'idle'}  threads {threads}  {policy:<7}  train "
                f"{r['train_steps_per_s']:6.2f} steps/s  decode "
                f"{r['decode_forwards_per_s']:6.1f} forwards/s",
                flush=True,
            )
        if spinner:
            stop.set()
            spinner.join()
    base = {busy: r for busy, t, pol, r in rows if t == 1}
    print("\nrelative to 1 thread (same load):")
    for busy, threads, policy, r in rows:
        b = base[busy]
        print(f"{'busy' if busy else 'idle'}  threads {threads}  {policy:<7}  train "
              f"{r['train_steps_per_s'] / b['train_steps_per_s']:.2f}x  decode "
              f"{r['decode_forwards_per_s'] / b['decode_forwards_per_s']:.2f}x")


if __name__ == "__main__":
    main()
