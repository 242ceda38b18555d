"""Supervised fine-tuning on trajectories, with exactly the action mask of RL.

The loss is the token-mean negative log-likelihood of the action tokens (mask 1) given
everything before them; prompt, observation and template tokens are context only:

    L = - Σ_t m_t log π(x_t | x_<t) / Σ_t m_t

Batches are length-bucketed (sorted by length, then cut) so padding stays small.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from taurl.trajectory import Trajectory


@dataclass(frozen=True)
class TokenBatch:
    """Right-padded rows. input_ids, action_mask, attention_mask: (B, L)."""

    input_ids: torch.Tensor
    action_mask: torch.Tensor
    attention_mask: torch.Tensor


def collate(trajs: Sequence[Trajectory], pad_id: int = 0) -> TokenBatch:
    width = max(t.num_tokens for t in trajs)
    ids = torch.full((len(trajs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(trajs), width), dtype=torch.float32)
    attn = torch.zeros((len(trajs), width), dtype=torch.long)
    for i, t in enumerate(trajs):
        n = t.num_tokens
        ids[i, :n] = torch.tensor(t.token_ids)
        mask[i, :n] = torch.tensor(t.action_mask, dtype=torch.float32)
        attn[i, :n] = 1
    return TokenBatch(ids, mask, attn)


def length_buckets(trajs: Sequence[Trajectory], batch_size: int, rng: random.Random) -> list[list[Trajectory]]:
    """Batches of similar length, in random order (sort by length, cut, shuffle the cuts)."""
    order = sorted(trajs, key=lambda t: t.num_tokens)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def masked_nll(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """Token-mean NLL over action tokens (see module docstring)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    targets = batch.input_ids[:, 1:]
    mask = batch.action_mask[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                                            reduction="none").view_as(mask)
    return (nll * mask).sum() / mask.sum().clamp(min=1.0)


def train_sft(model: torch.nn.Module, trajs: Sequence[Trajectory], *, epochs: int = 1, batch_size: int = 16,
              lr: float = 3e-3, weight_decay: float = 0.0, grad_clip: float = 1.0, seed: int = 0,
              pad_id: int = 0, max_steps: int | None = None, progress=None) -> list[float]:
    """Fine-tune `model` in place on the action tokens of `trajs`; returns the loss per step."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    losses: list[float] = []
    for _ in range(epochs):
        for group in length_buckets(trajs, batch_size, rng):
            loss = masked_nll(model, collate(group, pad_id))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            losses.append(loss.item())
            if progress is not None:
                progress(len(losses), losses[-1])
            if max_steps is not None and len(losses) >= max_steps:
                model.eval()
                return losses
    model.eval()
    return losses
