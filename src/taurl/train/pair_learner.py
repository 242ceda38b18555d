"""Trajectory DPO as a training stage: pairs of episodes of one task, a frozen reference.

The recipe's ``rl.objective: dpo`` (`taurl.recipe.stages`) trains on pairs instead of
advantages. Each update:

    pairs    = trajectory_pairs(batch)        # (chosen, rejected): higher and lower reward,
                                              # same task
    log π(τ) = Σ_t m_t log π(a_t | ·)         # action tokens only (m: the action mask)
    loss     = dpo_loss(π_θ, π_ref)           # taurl.train.objectives.dpo, mean over pairs
    AdamW step                                 # one new policy version

Pairs never cross tasks: episodes are grouped by ``task_id`` first, then paired by reward
(`taurl.credit.filters.preference_pairs`: best vs worst, or every pair above a margin).
With ``anchor: true`` a pair also shares an anchor state (GiGPO-style step-level pairs): the
two episodes are token-identical through at least their first turn's observation, and the
log-ratio is summed after the last shared token only (the shared action tokens would cancel
in Δ anyway; leaving them out makes the pair's signal the divergent step). The reference is
the stage's starting policy, frozen. Online, the batch is the update's fresh samples; offline
(``dpo.data: FILE``) it comes from a trajectory file.

`DPOLearner` has the `taurl.train.learner.Learner` interface the recipe's RL loop uses
(``assign``, ``update``, ``optimizer``, ``save_state``, ``load_state``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from taurl.credit.batch import drop_invalid
from taurl.credit.filters import preference_pairs
from taurl.data.trajectory import Trajectory
from taurl.errors import ConfigError
from taurl.train.lora import trainable
from taurl.train.objectives.dpo import dpo_loss
from taurl.train.optim import optimizer_step
from taurl.train.rows import action_logprobs, make_rows, model_device
from taurl.train.stage_options import DPOOptions


@dataclass(frozen=True)
class Pair:
    """Episode `chosen` scored above `rejected`, both of `task_id`; `start` is the first token
    of the log-ratio (0, or the end of the anchor prefix the two share)."""

    chosen: Trajectory
    rejected: Trajectory
    task_id: str
    start: int = 0


def shared_prefix(a: Trajectory, b: Trajectory) -> int:
    """How many leading tokens `a` and `b` have in common."""
    n = 0
    for x, y in zip(a.token_ids, b.token_ids, strict=False):
        if x != y:
            break
        n += 1
    return n


def _first_turn_end(t: Trajectory) -> int:
    """Tokens of `t` through its first turn's observation (its first anchor state)."""
    seg = t.turns[0].observation_segment if t.turns else None
    if seg is None:
        return t.num_tokens + 1  # no observation: no anchor state to share
    return sum(len(s.token_ids) for s in t.segments[:seg + 1])


def trajectory_pairs(trajs: Sequence[Trajectory], opts: DPOOptions) -> list[Pair]:
    """(chosen, rejected) pairs of valid episodes of the same task (module docstring)."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in drop_invalid(trajs)[0]:
        by_task[t.task_id].append(t)
    out: list[Pair] = []
    for task_id, eps in by_task.items():
        groups = [eps]
        if opts.anchor:  # episodes of this task that share their first turn, observation included
            keyed: dict[tuple[int, ...], list[Trajectory]] = defaultdict(list)
            for e in eps:
                keyed[tuple(e.token_ids[:_first_turn_end(e)])].append(e)
            groups = list(keyed.values())
        for g in groups:
            if len(g) < 2:
                continue
            scores = np.array([e.reward for e in g])
            chosen, rejected, _ = preference_pairs(scores, np.zeros(len(g), dtype=np.int64),
                                                   min_margin=opts.min_margin, mode=opts.pairs)
            for i, j in zip(chosen, rejected, strict=True):
                start = shared_prefix(g[i], g[j]) if opts.anchor else 0
                out.append(Pair(g[i], g[j], task_id, start))
    return out


def _rows(trajs: list[Trajectory], starts: list[int], pad_id: int, device: torch.device):
    rows = make_rows(trajs, None, pad_id, device)
    for i, s in enumerate(starts):  # the shared prefix takes no part in the log-ratio
        rows.mask[i, :s] = 0.0
    return rows


def pair_chunks(pairs: Sequence[Pair], max_tokens: int) -> list[list[int]]:
    """Indices of `pairs` in micro-batches of at most `max_tokens` padded tokens. A pair is
    two rows (chosen, rejected), each padded to the widest of its side in the chunk, so k
    pairs no wider than w cost at most 2·k·w. Sorted by width, then filled in order; a pair
    wider than the budget is a chunk of its own."""
    width = [max(p.chosen.num_tokens, p.rejected.num_tokens) for p in pairs]
    out: list[list[int]] = []
    for i in sorted(range(len(pairs)), key=width.__getitem__):
        if out and 2 * (len(out[-1]) + 1) * width[i] <= max_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


class DPOLearner:
    """One DPO optimizer step per update on the pairs of its batch (module docstring).

    The pairs are cut into micro-batches of at most `micro_batch_tokens` padded tokens
    (`pair_chunks`) whose gradients are accumulated: the loss is a mean over the P pairs of
    a per-pair term, so chunk c of P_c pairs contributes (P_c / P) times its own mean, the
    same loss and gradient as one batch of all P (to float rounding).
    """

    def __init__(self, model: torch.nn.Module, reference: torch.nn.Module, opts: DPOOptions, *,
                 lr: float,
                 grad_clip: float, pad_id: int, temperature: float = 1.0, weight_decay: float = 0.0,
                 lr_warmup_steps: int = 0, micro_batch_tokens: int = 6144):
        if reference is None:
            raise ConfigError("DPO needs a frozen reference policy (the stage's starting "
                              "checkpoint)")
        self.model, self.opts, self.pad_id, self.temperature = model, opts, pad_id, temperature
        self.lr, self.grad_clip, self.lr_warmup_steps = lr, grad_clip, lr_warmup_steps
        self.micro_batch_tokens = micro_batch_tokens
        self.reference = reference.to(model_device(model)).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(trainable(model), lr=lr, weight_decay=weight_decay)

    def assign(self, trajs: Sequence[Trajectory]) -> list[Pair]:
        return trajectory_pairs(trajs, self.opts)

    def save_state(self, checkpoint_dir: Any) -> None:  # nothing beside the policy
        return None

    def load_state(self, checkpoint_dir: Any) -> bool:
        return False

    def update(self, trajs: Sequence[Trajectory], version: int | None = None,
               credit: list[Pair] | None = None) -> dict[str, float]:
        """One DPO step on the pairs of `trajs` (or `credit`, the pairs `assign` built)."""
        t0 = time.perf_counter()
        pairs = self.assign(trajs) if credit is None else credit
        stats = {"learn/dpo_pairs": float(len(pairs)), "learn/rows": float(2 * len(pairs))}
        if not pairs:  # every task's episodes had one reward: nothing to prefer, no step
            return {**stats, "learn/skipped": 1.0, "learn/learn_s": time.perf_counter() - t0}
        self.model.eval()  # no dropout noise in the log-ratios (as the RL learner)
        self.optimizer.zero_grad(set_to_none=True)
        chunks = pair_chunks(pairs, self.micro_batch_tokens)
        sums: dict[str, float] = defaultdict(float)
        tokens = 0.0
        for chunk in chunks:
            share = len(chunk) / len(pairs)  # the global normaliser: a mean over all P pairs
            loss, m, n = self._chunk_loss([pairs[i] for i in chunk])
            (loss * share).backward()
            sums["learn/loss"] += float(loss.detach()) * share
            for k, v in m.items():  # every metric is a mean over pairs: weighted, the global mean
                sums[k] += v * share
            tokens += n
        norm, lr = optimizer_step(self.model, self.optimizer, self.lr, self.lr_warmup_steps,
                                  self.grad_clip)
        return {**stats, **sums, "learn/grad_norm": float(norm), "learn/lr": lr,
                "learn/action_tokens": tokens, "learn/micro_batches": float(len(chunks)),
                "learn/skipped": 0.0, "learn/learn_s": time.perf_counter() - t0}

    def _chunk_loss(self, pairs: list[Pair]) -> tuple[torch.Tensor, dict[str, float], float]:
        """The DPO loss of `pairs` (their mean), its metrics and their action tokens."""
        device = model_device(self.model)
        starts = [p.start for p in pairs]
        rc = _rows([p.chosen for p in pairs], starts, self.pad_id, device)
        rr = _rows([p.rejected for p in pairs], starts, self.pad_id, device)
        with torch.no_grad():
            ref_c = action_logprobs(self.reference, rc, self.temperature)[0]
            ref_r = action_logprobs(self.reference, rr, self.temperature)[0]
        lp_c = action_logprobs(self.model, rc, self.temperature)[0]
        lp_r = action_logprobs(self.model, rr, self.temperature)[0]
        loss, m = dpo_loss(lp_c, ref_c, rc.mask, lp_r, ref_r, rr.mask, beta=self.opts.beta,
                           label_smoothing=self.opts.label_smoothing)
        return loss, m, float(rc.mask.sum() + rr.mask.sum())
