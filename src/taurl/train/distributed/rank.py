"""One rank's learner: `taurl.train.learner.Learner`'s update on this rank's micro-batches.

Every rank receives the whole batch and its credited rows, so each cuts the same micro-batches
(`taurl.train.rows.micro_batches`) and computes the same split
(`taurl.train.distributed.split`); then it makes the rows of its own share only. The loss
is normalised exactly as with one rank:

    denom = Σ_ranks (action tokens of the rank's rows)    token-mean (one all-reduce)
          = rows of the whole batch                        the seq-mean aggregations
    loss_j = objective(micro-batch j) / denom
    grad   = Σ_ranks Σ_{j of the rank} ∇ loss_j            (gradients summed: `wrap`)

which is the single learner's Σ_j ∇ loss_j, in another order of float additions. Clipping
takes the norm of that whole gradient (DDP: replicated; FSDP: DTensor shards, whose fp64
sums of squares `taurl.train.optim.clip_global_norm` adds over ranks). The metrics are
reduced so rank 0 reports what one rank would (`taurl.train.distributed.metrics`).

Each rank runs `slots` passes per epoch, empty ones past its own micro-batches
(`wrap.empty_pass`), with the gradient reduction on the last pass only: FSDP's passes are
collectives, and a rank with no micro-batch must still join the reduction. An update with
nothing to learn (`learn/skipped`) measures every micro-batch on every rank (no split), so
those forwards match too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from taurl.data.trajectory import Trajectory
from taurl.train import chains
from taurl.train.credit_step import Credited
from taurl.train.distributed.group import Place
from taurl.train.distributed.metrics import combine_drift, combine_sums
from taurl.train.distributed.split import assign_micro_batches, slots
from taurl.train.distributed.wrap import empty_pass, global_norm, grad_sync, wrap
from taurl.train.learner import Learner, LearnerConfig, _Batch
from taurl.train.mismatch import Mismatch
from taurl.train.precision import checkpointed_eval
from taurl.train.rows import Rows, action_logprobs, make_rows, micro_batches


class RankLearner(Learner):
    """The learner of one rank of `place`'s group over `model` wrapped by `strategy`."""

    def __init__(self, model: torch.nn.Module, config: LearnerConfig, place: Place, strategy: str,
                 pad_id: int = 0, reference: torch.nn.Module | None = None):
        self.place = place
        super().__init__(wrap(model.to(place.device), strategy, place), config, pad_id=pad_id,
                         reference=reference)

    def update(self, trajs: Sequence[Trajectory], version: int | None = None,
               credit: Credited | None = None) -> dict[str, float]:
        """`Learner.update` on this rank's share of the credited rows (the driver's credit
        step: `taurl.train.credit_step`); every rank returns the whole batch's metrics."""
        t0, cfg = time.perf_counter(), self.config
        version, credit, stats = self._begin(trajs, version, credit)
        if credit.skip:  # measured on every micro-batch by every rank: no split
            return {**stats, "learn/learn_s": time.perf_counter() - t0}
        batch, n_slots = self._share(credit.kept, credit.advantages)
        ref = self._reference_logprobs(batch.rows)
        self.model.eval()  # as Learner.update: no dropout noise in the ratio
        sums: dict[str, float] = {}
        drift: list[Mismatch] = []
        prox: list[torch.Tensor] | None = [] if self.numerics.objective == "decoupled_ppo" else None
        for epoch in range(cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for j in range(n_slots):
                with grad_sync(self.model, on=j == n_slots - 1):
                    if j >= len(batch.rows):
                        empty_pass(self.model, self.pad_id, self.place.device)
                        continue
                    r = batch.rows[j]
                    with self.numerics.autocast(), checkpointed_eval(self.model):  # precision
                        lp, ent = action_logprobs(self.model, r, cfg.temperature, with_entropy=True,
                                                  entropy_grad=cfg.entropy_coef > 0)
                    if epoch == 0:
                        part = [batch.views[i] for i in batch.chunks[j]]
                        drift.append(self._mismatch(lp.detach(), r, part, version))
                        if prox is not None:
                            prox.append(lp.detach())
                    loss, m = self._loss(lp, ent, r, prox[j] if prox is not None else None,
                                         None if ref is None else ref[j], batch.denom)
                    self.numerics.backward(loss)
                    share = float(r.mask.sum()) / max(batch.n_tok, 1.0)
                    self._accumulate(sums, m, float(loss.detach()), share)
            norm, lr = self._step()
        self.model.eval()
        return {**stats, **self._reduced(batch, sums, drift, float(norm), lr, t0)}

    def _share(self, kept: list[Trajectory], adv: np.ndarray) -> tuple[_Batch, int]:
        """This rank's rows of `kept` with the whole batch's token count and denominator, and
        the passes every rank runs (`split.slots`)."""
        cfg, place = self.config, self.place
        views, adv = chains.split_streams(kept, adv, cfg.segment_weighting)
        chunks = micro_batches(views, cfg.micro_batch_tokens)
        costs = [len(c) * max(views[i].num_tokens for i in c) for c in chunks]  # padded tokens
        split = assign_micro_batches(costs, place.world_size)
        mine = [chunks[k] for k in split[place.rank]]
        keep = chains.with_untrained(self.token_keep)
        rows = [make_rows([views[i] for i in c], adv[c], self.pad_id, place.device, keep)
                for c in mine]
        n_tok = self._sum(sum(float(r.mask.sum()) for r in rows))  # the GLOBAL token count
        denom = n_tok if cfg.aggregation == "token-mean" else float(len(views))
        return _Batch(rows, views, mine, n_tok, denom), slots(split)

    def _sum(self, x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=self.place.device)
        dist.all_reduce(t)
        return float(t.item())

    def _step(self) -> tuple[torch.Tensor, float]:
        norm, lr = super()._step()
        return global_norm(norm), lr

    def _reduced(self, batch: _Batch, sums: dict[str, float], drift: list[Mismatch], norm: float,
                 lr: float, t0: float) -> dict[str, float]:
        """The update's learn/* and mismatch/* over every rank (as `Learner._batch_metrics`)."""
        mine = (sums, drift, *_padding(batch.rows), len(batch.rows))
        parts: list[Any] = [None] * self.place.world_size
        dist.all_gather_object(parts, mine)
        padded, real = sum(p[2] for p in parts), sum(p[3] for p in parts)
        dt = time.perf_counter() - t0
        return {**combine_sums([p[0] for p in parts]), **combine_drift([p[1] for p in parts]),
                "learn/grad_norm": norm, "learn/lr": lr, "learn/action_tokens": batch.n_tok,
                "learn/micro_batches": float(sum(p[4] for p in parts)),
                "learn/padding_frac": 1.0 - real / max(padded, 1), "learn/learn_s": dt,
                "learn/skipped": 0.0,
                "learn/tokens_per_s": real * self.config.epochs / dt if dt > 0 else 0.0,
                "learn/ranks": float(self.place.world_size)}


def _padding(rows: list[Rows]) -> tuple[int, float]:
    """(padded tokens, real tokens) of `rows`."""
    return sum(r.attention.numel() for r in rows), sum(float(r.attention.sum()) for r in rows)
