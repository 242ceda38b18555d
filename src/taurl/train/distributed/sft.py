"""SFT on N ranks: `taurl.train.sft.sft_step` on each rank's share, the step of one process.

Each SFT step is the masked NLL of its batch's action tokens over the GLOBAL token count
(`taurl.train.sft`):

    L = - Σ_ranks Σ_{micro-batches of the rank} Σ_t m_t log π(x_t | x_<t) / Σ_batch m_t

with the micro-batches split by tokens as in RL (`split`), gradients summed (`wrap`), the
clip on the whole gradient and the same learning-rate schedule (`sft_lr_factor`). The
driver (`ranked_sft_loop`) cuts the batches exactly as `taurl.train.sft.sft_loop` does (one
seed, one order), sends each to every rank and loads the ranks' weights into its model at
the end. Dropout (train mode, as in `sft_step`) draws on each rank's own generator, so a
model with dropout is not bitwise the single process's; the default policies have none.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from taurl.credit.batch import drop_invalid
from taurl.data.chains import stream_views
from taurl.data.trajectory import Trajectory
from taurl.train.distributed.group import Place
from taurl.train.distributed.split import assign_micro_batches, slots
from taurl.train.distributed.wrap import empty_pass, global_norm, grad_sync, wrap
from taurl.train.lora import trainable
from taurl.train.objectives import make_objective
from taurl.train.rows import action_logprobs, make_rows, micro_batches
from taurl.train.sft import SFTRun, length_buckets, sft_lr_factor


class RankSFT:
    """One rank's SFT optimizer and schedule over its replica or shard."""

    def __init__(self, model: torch.nn.Module, place: Place, strategy: str, *, lr: float,
                 warmup_steps: int, total_steps: int, grad_clip: float, pad_id: int,
                 micro_batch_tokens: int):
        self.place, self.pad_id, self.grad_clip = place, pad_id, grad_clip
        self.micro_batch_tokens = micro_batch_tokens
        self.model = wrap(model.to(place.device), strategy, place)
        self.optimizer = torch.optim.AdamW(trainable(self.model), lr=lr)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: sft_lr_factor(s, warmup=warmup_steps, total=total_steps))
        self.loss_fn = make_objective("sft")

    def step(self, trajs: Sequence[Trajectory]) -> dict[str, float]:
        """`sft_step` on this rank's share of `trajs`; the whole batch's metrics on every rank."""
        trajs, dropped = drop_invalid(trajs)  # as sft_step: no invalid record, no empty target
        trajs = [v for t in trajs for v in stream_views(t) if v.num_action_tokens]
        if not trajs:
            return {"sft/loss": 0.0, "sft/grad_norm": 0.0, "sft/action_tokens": 0.0,
                    "sft/invalid_samples_dropped": float(dropped), "sft/skipped": 1.0}
        chunks = micro_batches(trajs, self.micro_batch_tokens)
        costs = [len(c) * max(trajs[i].num_tokens for i in c) for c in chunks]
        split = assign_micro_batches(costs, self.place.world_size)
        dev = self.place.device
        rows = [make_rows([trajs[i] for i in chunks[k]], None, self.pad_id, dev)
                for k in split[self.place.rank]]
        n_tok = self._sum(sum(float(r.mask.sum()) for r in rows))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total, n = 0.0, slots(split)
        for j in range(n):
            with grad_sync(self.model, on=j == n - 1):
                if j >= len(rows):
                    empty_pass(self.model, self.pad_id, dev)
                    continue
                lp, _ = action_logprobs(self.model, rows[j])
                loss, _ = self.loss_fn(lp, rows[j].mask, denominator=max(n_tok, 1.0))
                loss.backward()
                total += float(loss.detach())
        norm = global_norm(torch.nn.utils.clip_grad_norm_(trainable(self.model), self.grad_clip))
        self.optimizer.step()
        self.schedule.step()
        self.model.eval()
        return {"sft/loss": self._sum(total), "sft/grad_norm": float(norm),
                "sft/action_tokens": n_tok,
                "sft/invalid_samples_dropped": float(dropped), "sft/skipped": 0.0,
                "sft/lr": self.schedule.get_last_lr()[0]}  # sft_loop's: after the schedule's step

    def _sum(self, x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=self.place.device)
        dist.all_reduce(t)
        return float(t.item())


def ranked_sft_loop(model: torch.nn.Module, trajs: Sequence[Trajectory], *, strategy: str,
                    world_size: int, device: str = "cpu", epochs: int, batch_size: int, lr: float,
                    warmup_steps: int, grad_clip: float, pad_id: int, micro_batch_tokens: int,
                    seed: int, max_steps: int = 0, max_seconds: float = 0.0,
                    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
                    pool: Any = None, start: Callable[[], Any] | None = None) -> SFTRun:
    """`taurl.train.sft.sft_loop` with its steps on `world_size` ranks; `model` ends with the
    trained weights. pool: ranks already started (left open); None starts them here with
    `start` (e.g. `taurl.train.distributed.launch.launch_ranks` bound to its arguments:
    Ray actors), by default `pool.start_ranks` (local processes, or yours)."""
    from taurl.train.distributed.pool import start_ranks
    from taurl.train.distributed.wire import to_bytes

    rng = random.Random(seed)  # the batches of sft_loop, in its order
    batches = [b for _ in range(epochs) for b in length_buckets(trajs, batch_size, rng)]
    if max_steps:
        batches = batches[:max_steps]
    ranks = pool if pool is not None else (start or (lambda: start_ranks(world_size, device)))()
    t0, steps, stopped_by = time.perf_counter(), 0, None
    try:
        ranks.call("build_sft", to_bytes(model), strategy, {
            "lr": lr, "warmup_steps": warmup_steps, "total_steps": len(batches),
            "grad_clip": grad_clip, "pad_id": pad_id, "micro_batch_tokens": micro_batch_tokens})
        for steps, batch in enumerate(batches, 1):  # noqa: B007 — `steps` is returned
            m = ranks.call("sft_step", list(batch))[0]
            if on_step is not None:
                on_step(steps, len(batches), {**m, "sft/elapsed_s": time.perf_counter() - t0})
            if max_seconds and time.perf_counter() - t0 > max_seconds and steps < len(batches):
                stopped_by = "sft_max_seconds"
                break
        ranks.pull_weights(model)
    finally:
        if pool is None:
            ranks.close()
    return SFTRun(steps, len(batches), stopped_by)
