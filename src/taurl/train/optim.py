"""The optimizer step of an RL update: clip, warm the learning rate up, step."""

from __future__ import annotations

import math

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
    norm = clip_global_norm([p for p in model.parameters() if p.requires_grad], grad_clip)
    step_lr = warmup_lr(lr, optimizer_steps(optimizer) + 1, warmup_steps)
    for group in optimizer.param_groups:
        group["lr"] = step_lr
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return norm, step_lr


def clip_global_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` with the norm's sum of squares taken in fp64.

        ‖g‖ = sqrt(Σ_tensors Σ_i g_i²)    (fp64 sum; sharded gradients: Σ over ranks too)
        g  ← g · min(1, max_norm / (‖g‖ + 1e-6))   (torch's clip coefficient)

    Why: torch sums an fp32 tensor's squares in fp32 (2.9e-5 relative error measured on
    SmolLM2-135M's gradient, benchmarks/dist_equivalence.py --floor) and FSDP2 takes each
    shard's norm apart (1.3e-5 from cutting every tensor in 2), so 1 rank and N ranks
    reported norms, and clipped steps, 1e-5 apart from the same gradient. In fp64 both
    sides compute the exact sum to ~1e-16, one rank and N ranks the same way; the gradients
    stay in their dtype (one tensor at a time is upcast). Returns the norm as an fp64 tensor.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    total = _sum_of_squares(grads)
    norm = total.sqrt()
    coef = max_norm / (float(norm) + 1e-6)
    if not coef < 1.0 and not math.isnan(coef):  # as torch: a NaN norm makes every grad NaN
        coef = 1.0
    torch._foreach_mul_(grads, coef)
    return norm


def _sum_of_squares(grads: list[torch.Tensor]) -> torch.Tensor:
    """Σ g_i² over `grads` in fp64, on the CPU. A sharded gradient (a DTensor, FSDP2) adds its
    local shard's squares, summed over its mesh; a replicated one counts once."""
    from torch.distributed.tensor import DTensor

    local = torch.zeros((), dtype=torch.float64, device=grads[0].device)
    sharded: dict[object, torch.Tensor] = {}
    for g in grads:
        if isinstance(g, DTensor) and any(p.is_shard() for p in g.placements):
            group = g.device_mesh.get_group()
            sq = _squares(g.to_local())
            sharded[group] = sharded.get(group, torch.zeros_like(local)) + sq
        else:
            local += _squares(g.to_local() if isinstance(g, DTensor) else g)
    for group, sq in sharded.items():
        torch.distributed.all_reduce(sq, group=group)
        local += sq
    return local.cpu()


# vector_norm(dtype=float64) upcasts its whole input first: 8 bytes per element of the
# largest gradient (4.4 GB for a 152k x 3584 embedding) at the step's memory peak. Chunks of
# 2^24 elements bound that copy at 128 MB.
_CHUNK = 1 << 24


def _squares(t: torch.Tensor) -> torch.Tensor:
    """Σ t_i² in fp64, upcasting at most `_CHUNK` elements at a time."""
    flat = t.reshape(-1)
    if flat.numel() <= _CHUNK:
        return torch.linalg.vector_norm(flat, dtype=torch.float64) ** 2
    return sum(torch.linalg.vector_norm(c, dtype=torch.float64) ** 2 for c in flat.split(_CHUNK))


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
