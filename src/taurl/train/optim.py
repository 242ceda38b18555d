"""The optimizer step of an RL update: clip, warm the learning rate up, step."""

from __future__ import annotations

import torch


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr: float,
                   warmup_steps: int, grad_clip: float,
                   scaler: torch.amp.GradScaler | None = None) -> tuple[torch.Tensor, float]:
    """Clip the accumulated gradient to `grad_clip`, set the warm-up learning rate, step.

    Returns the gradient norm before clipping and the learning rate used: one new version.
    scaler: fp16 mixed precision's loss scaler (`taurl.train.precision`): the gradients are
    unscaled before the clip, and a step whose gradients overflowed is skipped by it.
    """
    if scaler is not None:
        scaler.unscale_(optimizer)
    # the trained parameters (with LoRA the adapters'; the frozen base has no gradient)
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                          grad_clip)
    step_lr = warmup_lr(lr, optimizer_steps(optimizer) + 1, warmup_steps)
    for group in optimizer.param_groups:
        group["lr"] = step_lr
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return norm, step_lr


def warmup_lr(lr: float, step: int, warmup_steps: int) -> float:
    """The learning rate of optimizer step `step` (1-based): lr · min(1, step / warmup_steps).

    Linear warm-up (Goyal et al. 2017, "Accurate, Large Minibatch SGD"; the RL phase of verl
    and TRL warm up the same way). Why RL needs it here: AdamW's bias-corrected first step is
    lr · g / |g| per parameter whatever the gradient's size, so a fresh optimizer's first
    update moves nearly every weight by the full lr on the direction of one small batch
    (docs/experiments/long-credit.md, "Why one update breaks the greedy policy"). warmup_steps 0:
    lr.
    """
    return lr if warmup_steps <= 0 else lr * min(1.0, step / warmup_steps)


def optimizer_steps(optimizer: torch.optim.Optimizer) -> int:
    """Steps `optimizer` has taken, from its own state (so a resumed run's count continues):
    the largest per-parameter ``step`` of AdamW's state, 0 before the first step."""
    return max((int(st["step"]) for st in optimizer.state.values() if "step" in st), default=0)
