"""What a chain's segment count does to an episode's gradient, under each loss weighting.

    python benchmarks/segment_weighting.py [--out benchmarks/figures/segment_weighting.png]

One FrozenLake 8x8 map, the shortest-path expert's moves, played through the agent loop
twice: with a context large enough for the whole episode (1 token stream) and with a
context that the env's compaction hook (`rollout.compaction: {policy: env}`) cuts into 4
streams. The two episodes have the same sampled actions and the same outcome; only the
number of streams (and what each stream's prompt shows) differs. Their behaviour logprobs
are a tiny random policy's own on each stream (ratio 1), the group is completed with two
failures (so GRPO gives both successes the same advantage +A), and for each option the
script measures the norm of the gradient each success contributes to the batch's loss —
the loss of the whole batch with every other episode's advantages set to 0, so the batch's
denominators stay as they are:

* ``token`` (token-mean): every action token weighs 1/N;
* ``episode`` (token-mean): every episode weighs 1/E, its tokens 1/(E·n_e);
* ``token`` with ``seq-mean-token-mean``: every *stream* is a sequence, the verl#7580 case.

A second pair compares a short 1-stream success with a longer one (a detour: more moves)
cut into 4 streams, where the episodes differ in their action tokens too.

Prints a JSON line per pair and option and writes a bar chart. Deterministic (seeded); a
few seconds on one CPU thread.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import torch

from taurl import envs
from taurl.data.chains import stream_views
from taurl.data.trajectory import Segment, Trajectory
from taurl.envs.gym import frozenlake_expert, frozenlake_tasks
from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import create_policy
from taurl.policy.tokenizer import build_tokenizer
from taurl.rollout.compaction import CompactionConfig
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.synth import ScriptedEngine
from taurl.train import chains
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.rows import action_logprobs, make_rows

OPTIONS = (("token", "token-mean"), ("episode", "token-mean"), ("token", "seq-mean-token-mean"))


def play(tok, task, moves: list[str], max_context: int, reward: float) -> Trajectory:
    env = envs.make("frozenlake-v0", max_turns=40)
    env.system_prompt = ""
    cfg = RolloutConfig(
        max_turns=40, max_action_tokens=8, max_episode_tokens=400, max_context=max_context,
        compaction=CompactionConfig(policy="env"),
    )
    tr = asyncio.run(run_episode(ScriptedEngine(tok, moves), env, tok, task, seed=0, config=cfg))
    return dataclasses.replace(
        tr, reward=reward, reward_components={"outcome": reward}, source="policy"
    )


def on_policy(model, tr: Trajectory) -> Trajectory:
    """`tr` with each action's behaviour logprobs the model's own on its stream (ratio 1)."""
    segs, k = list(tr.segments), 0
    for view in stream_views(tr):
        lp = sequence_logprobs(model, view.token_ids).tolist()
        pos = 0
        for s in view.segments:
            if s.kind == "action":
                segs[k] = Segment("action", s.token_ids, tuple(lp[pos:pos + len(s.token_ids)]), 0)
            pos += len(s.token_ids)
            k += 1
    return dataclasses.replace(tr, segments=tuple(segs))


def streams_for(tok, task, moves, want: int) -> tuple[Trajectory, int]:
    """The expert's episode cut into exactly `want` streams: the largest context that does it."""
    for ctx in range(480, 150, -8):
        tr = play(tok, task, moves, ctx, 1.0)
        if tr.num_streams == want and tr.stop_reason == "goal":
            return tr, ctx
    raise SystemExit(f"no context gives {want} streams")


def contribution_norms(
    model, batch: list[Trajectory], weighting: str, aggregation: str
) -> list[float]:
    """|∇L_e| for each episode e: the batch loss with every other episode's advantages zeroed."""
    cfg = LearnerConfig(segment_weighting=weighting, aggregation=aggregation, lr=1e-3)
    learner = Learner(model, cfg, pad_id=0)
    a = learner.assign(batch)
    adv = a.credit.advantages
    views, vadv = chains.split_streams(batch, adv, weighting)
    owner = [i for i, t in enumerate(batch) for v in stream_views(t) if v.num_action_tokens]
    n_tok = sum(v.num_action_tokens for v in views)
    denom = n_tok if aggregation == "token-mean" else float(len(views))
    out = []
    for e in range(len(batch)):
        model.zero_grad(set_to_none=True)
        mine = vadv * np.array([[o == e] for o in owner], dtype=np.float64)
        rows = make_rows(views, mine, pad_id=0)
        lp, _ = action_logprobs(model, rows)
        loss, _ = learner.loss_fn(lp, rows.behaviour, rows.advantages, rows.mask, denominator=denom)
        loss.backward()
        out.append(
            float(
                torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None))
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="benchmarks/figures/segment_weighting.png")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tasks = frozenlake_tasks("train", 8, size=8, p_frozen=0.9)
    texts = [t.prompt for t in tasks] + [
        a for t in tasks for a in frozenlake_expert(t, random.Random(0))
    ]
    tok = build_tokenizer(texts, vocab_size=400)
    model = create_policy(tok, "tiny", seed=0).eval()
    task = tasks[0]
    moves = frozenlake_expert(task, random.Random(0))
    one = play(tok, task, moves, 1024, 1.0)
    four, ctx4 = streams_for(tok, task, moves, 4)
    # bumps into walls first: 6 more moves
    detour = ["<action>up</action>", "<action>left</action>"] * 3 + moves
    long4, ctxl = streams_for(tok, task, detour, 4)
    fail = ["<action>up</action>"] * 6
    fails = [play(tok, task, fail, 1024, 0.0), play(tok, task, fail[:3], 1024, 0.0)]
    pairs = {"same actions": (one, four), "longer episode": (one, long4)}
    results = []
    for name, (a, b) in pairs.items():
        batch = [on_policy(model, dataclasses.replace(t, episode_id=f"e{i}", group_id="g"))
                 for i, t in enumerate([a, b, *fails])]
        for weighting, aggregation in OPTIONS:
            g = contribution_norms(model, batch, weighting, aggregation)
            row = {"pair": name, "weighting": weighting, "aggregation": aggregation,
                   "streams": [batch[0].num_streams, batch[1].num_streams],
                   "action_tokens": [batch[0].num_action_tokens, batch[1].num_action_tokens],
                   "grad_norm": [round(g[0], 6), round(g[1], 6)], "ratio": round(g[1] / g[0], 3)}
            results.append(row)
            print(json.dumps(row))
    print(json.dumps({"contexts": {"4 streams (same actions)": ctx4, "4 streams (longer)": ctxl}}))
    plot(results, Path(args.out))


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for ax, pair in zip(axes, ("same actions", "longer episode"), strict=True):
        rows = [r for r in results if r["pair"] == pair]
        x = np.arange(len(rows))
        ax.bar(
            x - 0.2, [r["grad_norm"][0] for r in rows], 0.4,
            label=f"1 stream ({rows[0]['action_tokens'][0]} action tokens)",
        )
        ax.bar(x + 0.2, [r["grad_norm"][1] for r in rows], 0.4,
               label=f"4 streams ({rows[0]['action_tokens'][1]} action tokens)")
        for i, r in enumerate(rows):
            ax.text(i, max(r["grad_norm"]) * 1.02, f"×{r['ratio']:.2f}", ha="center", fontsize=8)
        ax.set_xticks(x, [f"{r['weighting']}\n{r['aggregation']}" for r in rows], fontsize=8)
        ax.set_title(f"{pair}: same outcome", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("|∇L| of the episode's part of the batch loss")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    main()
