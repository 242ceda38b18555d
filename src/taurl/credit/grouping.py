"""Vectorized statistics over groups of samples, shared by the group-relative estimators.

Every function takes flat arrays (M,) with a dense group index (M,) in [0, G) and uses
`np.bincount`, so a batch of a million turns costs a few passes over memory. A group whose
values are all equal has spread exactly zero here: its normalized values are set to 0, never
divided by (almost) zero, and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taurl.errors import ConfigError

# a group is "zero-variance" when its population std is below this fraction of its scale:
# two-pass std of equal floats is a few ulps, never exactly 0
ZERO_STD_RTOL = 1e-9


@dataclass(frozen=True)
class GroupStats:
    """Per-group count (G,), mean (G,), population std (G,) and zero-spread flag (G,)."""

    count: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    zero: np.ndarray


def group_stats(values: np.ndarray, group: np.ndarray, num_groups: int) -> GroupStats:
    """Mean and population std (ddof=0) of `values` (M,) in each of `num_groups` groups.

    Two passes (mean, then squared deviations) so that large offsets do not cancel.
    Empty groups get count 0, mean 0, std 0 and zero=True.
    """
    count = np.bincount(group, minlength=num_groups).astype(np.float64)
    safe = np.maximum(count, 1.0)
    mean = np.bincount(group, weights=values, minlength=num_groups) / safe
    dev = values - mean[group]
    std = np.sqrt(np.bincount(group, weights=dev * dev, minlength=num_groups) / safe)
    zero = std <= ZERO_STD_RTOL * (1.0 + np.abs(mean))
    return GroupStats(count=count, mean=mean, std=std, zero=zero)


def normalize_in_groups(values: np.ndarray, group: np.ndarray, num_groups: int, *,
                        scale: str = "std", eps: float = 1e-6) -> tuple[np.ndarray, GroupStats]:
    """(x - mean_g) / (std_g + eps) with scale="std", x - mean_g with scale="none".

    Values in zero-spread groups (all equal, or a group of one) become exactly 0.
    Returns the normalized values (M,) and the group statistics.
    """
    st = group_stats(values, group, num_groups)
    out = values - st.mean[group]
    if scale == "std":
        out = out / (st.std[group] + eps)
    elif scale != "none":
        raise ConfigError(f"scale must be 'std' or 'none', got {scale!r}")
    out[st.zero[group]] = 0.0
    return out, st


def whiten(values: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """(x - mean) / (std + eps) over all of `values` (M,); all-equal values give zeros."""
    if values.size == 0:
        return values.copy()
    mean = values.mean()
    std = values.std()
    if std <= ZERO_STD_RTOL * (1.0 + abs(mean)):
        return np.zeros_like(values)
    return (values - mean) / (std + eps)


def pair_ids(first: np.ndarray, second: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids (N, T) of the distinct pairs (first, second) at the True cells of `mask`.

    −1 where mask is False; returns the ids and the number of distinct pairs. One sort of
    the M masked cells: O(M log M).
    """
    flat = np.flatnonzero(mask.ravel())
    f = np.broadcast_to(first, mask.shape).ravel()[flat]
    s = np.broadcast_to(second, mask.shape).ravel()[flat]
    order = np.lexsort((s, f))
    new = np.ones(flat.size, dtype=bool)
    new[1:] = (np.diff(f[order]) != 0) | (np.diff(s[order]) != 0)
    ids = np.full(mask.size, -1, dtype=np.int64)
    ids[flat[order]] = np.cumsum(new) - 1
    return ids.reshape(mask.shape), int(new.sum())


def broadcast_rows(per_row: np.ndarray, turn_mask: np.ndarray) -> np.ndarray:
    """(N,) -> (N, T): each row's value on its real turns, 0 on padding."""
    return np.where(turn_mask, per_row[:, None], 0.0)


def group_counts(st: GroupStats) -> dict[str, float]:
    """Metrics about the groups: how many, how many carried no signal (all equal)."""
    present = st.count > 0
    return {
        "learn/groups": float(present.sum()),
        "learn/groups_zero_std": float((st.zero & present).sum()),
        "learn/groups_singleton": float((st.count == 1).sum()),
    }


def advantage_stats(adv: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Mean, std, |max| and zero fraction of the advantages on real turns."""
    a = adv[mask]
    if a.size == 0:
        return {"learn/adv_mean": 0.0, "learn/adv_std": 0.0, "learn/adv_abs_max": 0.0,
                "learn/adv_zero_frac": 0.0}
    return {
        "learn/adv_mean": float(a.mean()),
        "learn/adv_std": float(a.std()),
        "learn/adv_abs_max": float(np.abs(a).max()),
        "learn/adv_zero_frac": float((a == 0.0).mean()),
    }


def check_unit(name: str, value: float, *, low: float = 0.0, high: float = 1.0) -> None:
    """Raise ConfigError unless low <= value <= high (e.g. γ, λ)."""
    if not (low <= value <= high):
        raise ConfigError(f"{name} must be in [{low}, {high}], got {value!r}")


def check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")
