"""How per-token losses (B, L) become one scalar: the aggregation mode, chosen explicitly.

    token-mean               Σ_{b,t} m·ℓ / Σ m                         (DAPO, arXiv 2503.14476 §3.3)
    seq-mean-token-mean      (1/S) Σ_s [Σ_t m·ℓ / Σ_t m]               (GRPO, arXiv 2402.03300
                                                                        Eq. 3)
    seq-mean-token-sum       (1/S) Σ_s Σ_t m·ℓ
    seq-mean-token-sum-norm  (1/(S·C)) Σ_s Σ_t m·ℓ, C a constant        (Dr. GRPO, arXiv
                                                                        2503.20783 §3.2)

A *sequence* s is a row, or — when one trajectory spans several rows (turn-per-row
training, a long episode cut into windows) — every row with the same ``traj_index``, so a
trajectory is normalized once, as a whole. S counts the sequences with at least one
masked token. C defaults to the row width L; pass the generation budget to keep it
constant across batches.

``denominator`` overrides the token count (token-mean) or S (seq-*): pass the global count
when one batch is split into micro-batches whose gradients are accumulated.
"""

from __future__ import annotations

import torch
from torch import Tensor

from taurl.credit.registry import did_you_mean
from taurl.errors import ConfigError

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm")


def check_aggregation(mode: str) -> None:
    if mode not in AGGREGATIONS:
        raise ConfigError(f"unknown aggregation {mode!r}.{did_you_mean(mode, list(AGGREGATIONS))} "
                          f"One of: {', '.join(AGGREGATIONS)}")


def masked(values: Tensor, mask: Tensor) -> Tensor:
    """`values` where mask, else 0 — with `where`, so NaN/inf off the mask cannot leak in."""
    return torch.where(mask.bool(), values,
                       torch.zeros((), dtype=values.dtype, device=values.device))


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` over the masked tokens (0 when there are none)."""
    m = mask.bool()
    return masked(values, m).sum() / m.sum().clamp(min=1)


def sequence_sums(values: Tensor, mask: Tensor,
                  traj_index: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sequence sums (S,) of masked `values`, token counts (S,), and each row's sequence (B,).

    Without `traj_index` each row is a sequence. With it, rows sharing an index are pooled.
    """
    row_sum = masked(values, mask).sum(dim=-1)
    row_count = mask.bool().sum(dim=-1).to(values.dtype)
    if traj_index is None:
        return row_sum, row_count, torch.arange(values.shape[0], device=values.device)
    idx = traj_index.to(device=values.device, dtype=torch.long)
    num = int(idx.max().item()) + 1 if idx.numel() else 0
    seq_sum = torch.zeros(num, dtype=values.dtype, device=values.device).index_add(0, idx, row_sum)
    seq_count = torch.zeros(num, dtype=values.dtype,
                            device=values.device).index_add(0, idx, row_count)
    return seq_sum, seq_count, idx


def aggregate(values: Tensor, mask: Tensor, mode: str, *, traj_index: Tensor | None = None,
              norm_constant: float | None = None, denominator: float | None = None) -> Tensor:
    """Reduce per-token `values` (B, L) over `mask` (B, L) to a scalar with `mode` (see above).

    traj_index: (B,) int, the trajectory of each row (rows of one trajectory pooled).
    An all-zero mask gives 0, never NaN.
    """
    check_aggregation(mode)
    if mode == "token-mean":
        count = (mask.bool().sum().to(values.dtype).clamp(min=1) if denominator is None
                 else denominator)
        return masked(values, mask).sum() / count
    seq_sum, seq_count, _ = sequence_sums(values, mask, traj_index)
    present = seq_count > 0
    num_seq = present.sum().to(values.dtype).clamp(min=1) if denominator is None else denominator
    if mode == "seq-mean-token-mean":
        return (seq_sum / seq_count.clamp(min=1)).sum() / num_seq
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / num_seq
    constant = float(mask.shape[-1]) if norm_constant is None else float(norm_constant)
    if not constant > 0:
        raise ConfigError(f"norm_constant must be > 0, got {norm_constant!r}")
    return seq_sum.sum() / (num_seq * constant)
