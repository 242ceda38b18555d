"""Segment-level credit: cut each trajectory at its sub-goal boundaries first.

The environment declares where a sub-goal ends (``batch.segment_id``; see
`TurnBatch.from_trajectories`). Each segment is then treated as a short episode of its own:
its score is the discounted sum of the rewards inside it, and it is compared only with the
segments in the same position (k-th segment) of the other trajectories of its group. No
return crosses a boundary, so a late failure does not penalize an earlier sub-goal that was
reached.

    S_{i,k} = Σ_{t in seg k} γ^(t − start_k) r'_{i,t}
    A_{i,t} = (S_{i,k} − mean_{(g,k)} S) / (std_{(g,k)} S + eps)      for t in segment k

r' are the step and process rewards; the trajectory's terminal reward is added to the last
segment (outcome="last") or to every segment (outcome="all", the default: with no sub-goal
rewards this is GRPO run inside each segment position).

Source: the segment-first ("cut the trajectory, then estimate") scheme of the project
seeds; group-relative scoring per segment follows GRPO (arXiv 2402.03300). The grouping
by segment position is our choice: a segment is compared with the same sub-goal attempt
of its siblings.
"""

from __future__ import annotations

import numpy as np

from taurl.credit.batch import Credit, TurnBatch
from taurl.credit.grouping import (
    advantage_stats,
    check_positive,
    check_unit,
    group_counts,
    normalize_in_groups,
)
from taurl.errors import ConfigError


def segment_ids(batch: TurnBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Number the segments of real turns.

    Returns ids (N, T): segment of each turn, −1 on padding (segments numbered row-major);
    and per segment (S,): its row, its first turn, and its slot — a dense id of the pair
    (episode group, segment position) inside which segments are compared.
    """
    n, t = batch.turn_mask.shape
    seg = np.where(batch.turn_mask, batch.segment_id, -1)
    # a segment starts at turn 0 and wherever segment_id changes along the row
    start = batch.turn_mask.copy()
    start[:, 1:] &= seg[:, 1:] != seg[:, :-1]
    ids = np.cumsum(start.ravel()) - 1
    ids = np.where(batch.turn_mask.ravel(), ids, -1).reshape(n, t)
    rows, first = np.nonzero(start)  # row-major, so the j-th start is segment j
    pairs = np.stack([batch.group[rows], batch.segment_id[rows, first]], axis=1)
    _, slot = np.unique(pairs, axis=0, return_inverse=True)
    return ids, rows, first, slot.reshape(-1).astype(np.int64)


def segment_grpo(batch: TurnBatch, *, gamma: float = 1.0, outcome: str = "all", scale: str = "std",
                 eps: float = 1e-6) -> Credit:
    """Group-relative advantage per sub-goal segment (formula in the module docstring)."""
    check_unit("gamma", gamma)
    check_positive("eps", eps)
    if outcome not in ("all", "last"):
        raise ConfigError(f"segment credit outcome must be 'all' or 'last', got {outcome!r}")
    ids, seg_row, seg_first, slot = segment_ids(batch)
    num = seg_row.size
    mask = batch.turn_mask
    r = np.where(mask, batch.step_rewards + batch.process_rewards, 0.0)
    if outcome == "last":
        n_turns = batch.num_turns
        rows = np.flatnonzero(n_turns > 0)
        r[rows, n_turns[rows] - 1] += batch.rewards[rows]
    cols = np.broadcast_to(np.arange(mask.shape[1]), mask.shape)[mask]
    seg = ids[mask]
    discount = gamma ** (cols - seg_first[seg]).astype(np.float64)  # from the segment's first turn
    seg_score = np.bincount(seg, weights=r[mask] * discount, minlength=num)
    if outcome == "all":
        seg_score = seg_score + batch.rewards[seg_row]
    num_slots = int(slot.max()) + 1 if num else 0
    adv_seg, st = normalize_in_groups(seg_score, slot, num_slots, scale=scale, eps=eps)
    adv = np.zeros(mask.shape)
    adv[mask] = adv_seg[seg]
    counts = group_counts(st)
    stats = {
        "learn/segments": float(num),
        "learn/segment_groups": counts["learn/groups"],
        "learn/segment_groups_zero_std": counts["learn/groups_zero_std"],
        **advantage_stats(adv, mask),
    }
    return Credit(advantages=adv, stats=stats)
