"""Supervised fine-tuning on trajectories, with exactly the action mask of RL.

Each step is `sft_step` (below): the token-mean negative log-likelihood of the
action tokens (mask 1) given everything before them; prompt, observation and template
tokens are context only:

    L = - Σ_t m_t log π(x_t | x_<t) / Σ_t m_t

Batches are length-bucketed (sorted by length, then cut) so padding stays small.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from taurl.credit.batch import drop_invalid
from taurl.data.chains import stream_views
from taurl.data.trajectory import Trajectory
from taurl.train.chains import trained_tokens, untrained_keep
from taurl.train.lora import trainable
from taurl.train.objectives import make_objective
from taurl.train.rows import action_logprobs, make_rows, micro_batches, model_device

log = logging.getLogger("taurl.sft")


def length_buckets(trajs: Sequence[Trajectory], batch_size: int,
                   rng: random.Random) -> list[list[Trajectory]]:
    """Batches of similar length, in random order (sort by length, cut, shuffle the cuts)."""
    order = sorted(trajs, key=lambda t: t.num_tokens)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def sft_lr_factor(step: int, *, warmup: int, total: int) -> float:
    """SFT learning-rate multiplier at optimizer step `step` (0-based), W = warmup, T = total:

        f(s) = (s + 1) / W                          for s < W
        f(s) = 1 - 0.9 · min((s - W) / (T - W), 1)  otherwise

    a linear warm-up to the peak, then a linear decay to a tenth. In exploratory runs a tiny
    policy built from scratch and trained at a 5e-3 peak with no warm-up was far slower to
    learn to copy names than at 3e-3 with one (not a benchmark: no controlled comparison).
    """
    if step < warmup:
        return (step + 1) / warmup
    return 1.0 - 0.9 * min((step - warmup) / max(total - warmup, 1), 1.0)


def train_sft(model: torch.nn.Module, trajs: Sequence[Trajectory], *, epochs: int = 1,
              batch_size: int = 16,
              lr: float = 3e-3, weight_decay: float = 0.0, grad_clip: float = 1.0, seed: int = 0,
              pad_id: int = 0, max_steps: int | None = None,
              progress: Callable[[int, float], None] | None = None) -> list[float]:
    """Fine-tune `model` in place on the action tokens of `trajs`; returns the loss per step."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(trainable(model), lr=lr, weight_decay=weight_decay)
    losses: list[float] = []
    for _ in range(epochs):
        for group in length_buckets(trajs, batch_size, rng):
            losses.append(sft_step(model, opt, group, pad_id=pad_id,
                                   grad_clip=grad_clip)["sft/loss"])
            if progress is not None:
                progress(len(losses), losses[-1])
            if max_steps is not None and len(losses) >= max_steps:
                return losses
    return losses


@dataclass(frozen=True)
class SFTRun:
    """What `sft_loop` did: the steps it took, the steps it planned, and what cut it short."""

    steps: int
    planned: int  # sft_epochs' steps, or max_steps when smaller: the budget that fixes the result
    # "sft_max_seconds": the safety cap cut it (a machine-dependent result)
    stopped_by: str | None = None


def sft_loop(model: torch.nn.Module, trajs: Sequence[Trajectory], *, epochs: int, batch_size: int,
             lr: float,
             warmup_steps: int, grad_clip: float, pad_id: int, micro_batch_tokens: int, seed: int,
             max_steps: int = 0, max_seconds: float = 0.0,
             on_step: Callable[[int, int, dict[str, float]], None] | None = None) -> SFTRun:
    """The recipe's SFT phase: length-bucketed masked NLL with the `sft_lr_factor` schedule over
    `planned` steps — every step of `epochs`, or the first `max_steps` (0: all) — so the steps,
    and the result, are fixed by the seed on any machine. `max_seconds` (0: none) is a safety
    cap only: a loop it cuts says so (`SFTRun.stopped_by`). on_step(step, total, metrics) after
    each."""
    import time

    opt = torch.optim.AdamW(trainable(model), lr=lr)
    rng = random.Random(seed)
    batches = [b for _ in range(epochs) for b in length_buckets(trajs, batch_size, rng)]
    if max_steps:
        batches = batches[:max_steps]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: sft_lr_factor(s, warmup=warmup_steps, total=len(batches)))
    t0, steps, stopped_by = time.perf_counter(), 0, None
    model.train()
    for steps, batch in enumerate(batches, 1):  # noqa: B007 — `steps` is returned
        m = sft_step(model, opt, batch, pad_id=pad_id, grad_clip=grad_clip,
                     micro_batch_tokens=micro_batch_tokens)
        sched.step()
        if on_step is not None:
            on_step(steps, len(batches), {**m, "sft/lr": sched.get_last_lr()[0],
                                          "sft/elapsed_s": time.perf_counter() - t0})
        if max_seconds and time.perf_counter() - t0 > max_seconds and steps < len(batches):
            log.warning("SFT cut by sft_max_seconds=%g after %d of %d steps: this result depends "
                        "on the machine's speed (set sft_max_steps for a budget the seed fixes)",
                        max_seconds, steps, len(batches))
            stopped_by = "sft_max_seconds"
            break
    model.eval()
    return SFTRun(steps, len(batches), stopped_by)


def read_sft_file(path: str, env: str) -> list:
    """Trajectories of an export-format JSONL file for SFT; rows that are not valid records
    of `env` are logged and left out (and counted), the rest kept."""
    from taurl.data.export import read_jsonl
    from taurl.data.trajectory import Trajectory, check_trajectory
    from taurl.errors import Error

    keep, bad = [], []
    for i, row in enumerate(read_jsonl(path), 1):
        try:
            traj = Trajectory.from_dict({k: v for k, v in row.items()
                                         if k in Trajectory.__dataclass_fields__})
        except Exception as e:  # noqa: BLE001 — a broken row is reported, the others are kept
            bad.append(f"row {i}: {type(e).__name__}: {e}")
            continue
        problems = [str(p) for p in check_trajectory(traj)]
        if traj.env_name != env:
            problems.append(f"env {traj.env_name!r} is not the run's {env!r}")
        (bad.append(f"row {i} ({traj.episode_id}): {'; '.join(problems)}") if problems
         else keep.append(traj))
    for why in bad:
        log.warning("sft_data %s: %s", path, why)
    if not keep:
        raise Error(f"sft_data {path} holds no usable trajectory of {env} ({len(bad)} bad rows; "
                    "see the log)")
    log.info("SFT on %d trajectories of %s (%d rows left out)", len(keep), path, len(bad))
    return keep


def sft_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, trajs: Sequence[Trajectory],
             *, pad_id: int, grad_clip: float = 1.0,
             micro_batch_tokens: int = 6144) -> dict[str, float]:
    """One SFT optimizer step: token-mean NLL of the action tokens (the `sft` objective).

    Exactly the action mask of RL (a summary recorded as untrained is off it, as there); the
    batch is cut into length-bucketed micro-batches whose gradients are accumulated with the
    global token count as denominator. Invalid samples are left out (counted as
    ``sft/invalid_samples_dropped``); a batch of nothing but invalid samples takes no step.
    """
    sft = make_objective("sft")
    trajs, dropped = drop_invalid(trajs)
    # a chain trains as its token streams. A stream with nothing trained has no target (the
    # prompt alone filled the context; a compaction's prompt and its close; only a summary
    # recorded as untrained): a micro-batch of only such rows would have no gradient at all
    trajs = [v for t in trajs for v in stream_views(t) if trained_tokens(v)]
    if not trajs:
        return {"sft/loss": 0.0, "sft/grad_norm": 0.0, "sft/action_tokens": 0.0,
                "sft/invalid_samples_dropped": float(dropped), "sft/skipped": 1.0}
    chunks = micro_batches(trajs, micro_batch_tokens)
    device = model_device(model)
    # a summary recorded as untrained (compaction summary: masked) stays off the loss, as in RL
    rows = [make_rows([trajs[i] for i in c], None, pad_id, device, token_keep=untrained_keep)
            for c in chunks]
    n_tok = sum(float(r.mask.sum()) for r in rows)
    model.train()  # SFT keeps the model's dropout (module docstring)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for r in rows:
        lp, _ = action_logprobs(model, r)
        loss, _ = sft(lp, r.mask, denominator=max(n_tok, 1.0))
        loss.backward()
        total += float(loss.detach())
    norm = torch.nn.utils.clip_grad_norm_(trainable(model), grad_clip)
    optimizer.step()
    model.eval()
    return {"sft/loss": total, "sft/grad_norm": float(norm), "sft/action_tokens": n_tok,
            "sft/invalid_samples_dropped": float(dropped), "sft/skipped": 0.0}
