"""Does the copy warm-up help SFT teach a policy built from scratch to copy names?

Two arms from the same tiny policy v0 and the same demonstrations (configs/demo.yaml
settings): SFT alone, and the copy warm-up (taurl.train.copy_warmup) followed by SFT.
Every `--every` SFT steps it measures, teacher-forced on expert episodes of *holdout*
cities (split_by="city"), the share whose whole query (``<search> name</search>``) and
whose whole answer (``<answer> country</answer>``) are the greedy prediction.

    .venv/bin/python benchmarks/copy_warmup.py                      # TrainConfig defaults
    .venv/bin/python benchmarks/copy_warmup.py --config configs/demo.yaml

The arms run one after another on one torch thread (pass --arm to run one). SFT runs the
config's planned steps (epochs x demos / batch size), capped by --steps.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import time

import torch

from taurl import envs
from taurl.data.trajectory import Trajectory
from taurl.envs.search import generate_tasks
from taurl.envs.search.expert import search_expert
from taurl.envs.search.hooks import SearchPolicyHooks
from taurl.policy.model import create_policy
from taurl.policy.tokenizer import build_tokenizer
from taurl.recipe.config import TrainConfig
from taurl.recipe.validate import load_config
from taurl.rollout.synth import demonstrations
from taurl.train.copy_warmup import copy_warmup
from taurl.train.sft import length_buckets, sft_lr_factor, sft_step


@torch.no_grad()
def exact_spans(model, tok, trajs: list[Trajectory]) -> tuple[float, float]:
    """Share of episodes whose first query span / answer span is entirely the greedy
    prediction (from the tag on: the search-or-answer choice before it is the policy's)."""
    tags = tok.convert_tokens_to_ids(["<search>", "<answer>"])
    hits = [0, 0]
    for i in range(0, len(trajs), 64):
        batch = trajs[i:i + 64]
        width = max(t.num_tokens for t in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id)
        att = torch.zeros((len(batch), width), dtype=torch.long)
        for j, t in enumerate(batch):
            ids[j, :t.num_tokens] = torch.tensor(t.token_ids)
            att[j, :t.num_tokens] = 1
        pred = model(input_ids=ids, attention_mask=att).logits.argmax(-1)
        for j, t in enumerate(batch):
            pos, done = 0, [False, False]
            for seg in t.segments:
                ids_k = list(seg.token_ids)
                # the first search, then the answer (two-hop episodes search twice)
                for k in (0, 1):
                    if seg.kind == "action" and not done[k] and tags[k] in ids_k:
                        start, end = pos + ids_k.index(tags[k]), pos + len(ids_k)
                        hits[k] += bool((pred[j, start - 1:end - 1] == ids[j, start:end]).all())
                        done[k] = True
                pos += len(ids_k)
    return hits[0] / len(trajs), hits[1] / len(trajs)


def run_arm(arm: str, args, cfg: TrainConfig, tok, demos, probe, names) -> list[dict]:
    model = create_policy(tok, cfg.model_size, seed=0)
    rows = []
    t0 = time.perf_counter()
    if arm == "warmup":
        copy_warmup(model, tok, names, steps=cfg.warmup_options.get("steps", 300),
                    batch_size=cfg.warmup_options.get("batch_size", 64), lr=cfg.sft_lr, seed=0)
    warm_s = time.perf_counter() - t0
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr)
    rng = random.Random(0)
    batches = [
        b for _ in range(cfg.sft_epochs) for b in length_buckets(demos, cfg.sft_batch_size, rng)
    ][: args.steps]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: sft_lr_factor(s, warmup=cfg.sft_warmup_steps, total=len(batches)))
    t1 = time.perf_counter()
    for step, batch in enumerate(batches, 1):
        m = sft_step(model, opt, batch, pad_id=tok.pad_token_id, grad_clip=cfg.grad_clip)
        sched.step()
        if step % args.every == 0 or step == len(batches):
            q, a = exact_spans(model, tok, probe)
            row = {
                "arm": arm,
                "sft_step": step,
                "sft_loss": round(m["sft/loss"], 3),
                "query_exact": q,
                "answer_exact": a,
                "warmup_s": round(warm_s, 1),
                "sft_s": round(time.perf_counter() - t1, 1),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", help="a train YAML (default: TrainConfig's defaults)")
    ap.add_argument("--steps", type=int, default=1500, help="at most this many SFT steps per arm")
    ap.add_argument("--every", type=int, default=300, help="measure every this many SFT steps")
    ap.add_argument("--probe", type=int, default=300, help="holdout expert episodes to measure on")
    ap.add_argument("--arm", choices=["sft", "warmup"], nargs="+", default=["sft", "warmup"])
    ap.add_argument("--demos", type=int, default=0, help="demonstrations (0: the config's)")
    ap.add_argument("--warmup-steps", type=int, default=0,
                    help="copy warm-up steps (0: the config's); with --demos a tiny budget")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(TrainConfig, path=args.config) if args.config else TrainConfig()
    if args.demos:
        cfg = dataclasses.replace(cfg, demos=args.demos)
    if args.warmup_steps:
        warmup = {**cfg.warmup_options, "steps": args.warmup_steps}
        cfg = dataclasses.replace(cfg, warmup_options=warmup)
    opts = cfg.task_options

    def make():
        env = envs.make(cfg.env, **cfg.env_kwargs())
        if cfg.system_prompt is not None:
            env.system_prompt = cfg.system_prompt
        return env

    tok = build_tokenizer(SearchPolicyHooks().tokenizer_texts(make(), [], **opts), cfg.vocab_size)
    tasks = generate_tasks("train", n=cfg.demos, seed=0, **opts)
    held = generate_tasks("holdout", n=args.probe, seed=1, **opts)
    rc = cfg.rollout_config()
    demos = asyncio.run(
        demonstrations(
            tasks, tok, make, expert=search_expert, expert_options=cfg.expert_options, config=rc
        )
    )
    probe = asyncio.run(
        demonstrations(
            held, tok, make, expert=search_expert, expert_options={"p_skip_search": 0.0}, config=rc,
            episode_prefix="probe",
        )
    )
    names = list(
        dict.fromkeys([t.metadata["subject"] for t in tasks] + [t.answers[0] for t in tasks])
    )
    rows = [r for arm in args.arm for r in run_arm(arm, args, cfg, tok, demos, probe, names)]
    print("\n| arm | SFT step | SFT loss | query exact | answer exact | warm-up s | SFT s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['sft_step']} | {r['sft_loss']:.3f} | {r['query_exact']:.2f} | "
              f"{r['answer_exact']:.2f} | {r['warmup_s']} | {r['sft_s']} |")


if __name__ == "__main__":
    main()
