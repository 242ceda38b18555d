"""The metrics of an RL update that takes no step, and which rows are on-policy.

An update with nothing to learn from (every group of equal reward, or a critic warm-up)
still measures the policy's entropy and the learner-vs-behaviour mismatch, in the learner's
own numerics (its autocast, `taurl.train.precision`), so a run's mismatch curve has no gaps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from taurl.data.trajectory import Trajectory
from taurl.train import chains
from taurl.train.mismatch import Mismatch, combine_mismatch, logprob_mismatch
from taurl.train.rows import action_logprobs, make_rows, micro_batches, model_device


def idle_metrics(model: torch.nn.Module, trajs: Sequence[Trajectory], version: int, cfg: Any,
                 pad_id: int, autocast: Any = None) -> dict[str, float]:
    """Entropy and ``mismatch/*`` of `trajs` under `model` (cfg: the LearnerConfig), no step."""
    ent_sum = tok = 0.0
    device = model_device(model)
    drift: list[Mismatch] = []
    trajs = [v for t in trajs for v in chains.stream_views(t)]
    model.eval()
    with torch.no_grad(), (autocast() if autocast is not None else contextlib.nullcontext()):
        for c in micro_batches(trajs, cfg.micro_batch_tokens):
            # zero advantages: the RL rows (behaviour logprobs), though no step is taken
            part = [trajs[i] for i in c]
            zeros = np.zeros((len(part), max(1, *(len(t.turns) for t in part))))  # (N, turns)
            r = make_rows(part, zeros, pad_id, device)
            lp, ent = action_logprobs(model, r, cfg.temperature, with_entropy=True)
            ent_sum += float((ent * r.mask).sum()) if ent is not None else 0.0
            tok += float(r.mask.sum())
            keep = r.mask * fresh_rows(part, version, r.mask)[:, None]
            drift.append(logprob_mismatch(lp, r.behaviour, keep, clip_low=cfg.eps_low,
                                          clip_high=cfg.eps_high))
    return {"learn/entropy": ent_sum / max(tok, 1.0), "learn/grad_norm": 0.0, "learn/pg_loss": 0.0,
            "learn/loss": 0.0, "learn/clip_frac": 0.0, "learn/approx_kl": 0.0,
            "learn/action_tokens": 0.0, "learn/tokens_per_s": 0.0,
            **combine_mismatch(drift).as_stats()}


def fresh_rows(trajs: Sequence[Trajectory], version: int, like: torch.Tensor) -> torch.Tensor:
    """(N,) 1.0 where every action of the row was sampled by `version` (the learner's weights)."""
    return torch.tensor([min(t.policy_versions, default=-1) == version for t in trajs],
                        dtype=like.dtype, device=like.device)
