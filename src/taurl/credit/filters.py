"""Batch filters: which trajectories (or pairs) to train on, and how many were dropped.

Each filter is a pure function of per-trajectory arrays and returns a `Selection`: the kept
row indices (sorted) and counts for the metrics. Apply it with ``batch.select(sel.kept)``;
filters compose by selecting in turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taurl.credit.grouping import group_stats
from taurl.errors import ConfigError


@dataclass(frozen=True)
class Selection:
    """kept: (K,) int64 sorted row indices; stats: ``learn/filter_…`` counts."""

    kept: np.ndarray
    stats: dict[str, float]


def _dense(group: np.ndarray) -> tuple[np.ndarray, int]:
    _, dense = np.unique(np.asarray(group), return_inverse=True)
    dense = dense.reshape(-1).astype(np.int64)
    return dense, int(dense.max()) + 1 if dense.size else 0


def zero_variance_filter(scores: np.ndarray, group: np.ndarray) -> Selection:
    """Drop every group whose scores are all equal (DAPO dynamic sampling).

    Source: DAPO, arXiv 2503.14476, §3.2 (keep groups with 0 < #correct < G): such
    groups have zero advantage under any group baseline and only dilute the batch. Groups of
    one are dropped too.
    """
    scores = np.asarray(scores, dtype=np.float64)
    dense, g = _dense(group)
    st = group_stats(scores, dense, g)
    keep_group = ~st.zero
    kept = np.flatnonzero(keep_group[dense])
    return Selection(kept, {
        "learn/filter_zero_var_groups_dropped": float((~keep_group).sum()),
        "learn/filter_zero_var_groups_kept": float(keep_group.sum()),
        "learn/filter_zero_var_rows_dropped": float(scores.size - kept.size),
    })


def zero_advantage_filter(advantages: np.ndarray, turn_mask: np.ndarray, group: np.ndarray,
                          scores: np.ndarray | None = None, atol: float = 1e-9) -> Selection:
    """Drop every group whose advantages are all zero on every real turn: nothing to learn.

    The filter DAPO applies (arXiv 2503.14476, §3.2) on the advantages actually trained on,
    not on the outcomes: with step-level credit (GiGPO, a critic) a group whose members share
    one outcome but took different paths still carries signal, and is kept. For an
    outcome-only estimator (GRPO, RLOO) both rules drop the same groups. Groups of one under
    a group baseline have zero advantage and are dropped with them.

    advantages, turn_mask: (N, T); group: (N,); scores: (N,) episode returns, given to count
    ``learn/filter_zero_var_groups`` (equal-outcome groups) and how many of them step
    credit kept (``learn/filter_zero_var_groups_kept``).
    """
    dense, g = _dense(group)
    live = np.any(np.abs(np.where(turn_mask, advantages, 0.0)) > atol, axis=1)  # (N,)
    keep_group = np.zeros(g, dtype=bool)
    np.logical_or.at(keep_group, dense, live)
    kept = np.flatnonzero(keep_group[dense])
    stats = {
        "learn/filter_zero_adv_groups_dropped": float((~keep_group).sum()),
        "learn/filter_zero_adv_groups_kept": float(keep_group.sum()),
        "learn/filter_zero_adv_rows_dropped": float(dense.size - kept.size),
    }
    if scores is not None:
        same = group_stats(np.asarray(scores, dtype=np.float64), dense, g).zero
        stats["learn/filter_zero_var_groups"] = float(same.sum())
        stats["learn/filter_zero_var_groups_kept"] = float((same & keep_group).sum())
    return Selection(kept, stats)


def top_std_groups(scores: np.ndarray, group: np.ndarray, keep_fraction: float) -> Selection:
    """Keep the ceil(p·G) groups with the largest score std (StarPO-S variance filtering).

    Source: RAGEN, arXiv 2504.20073 (StarPO-S: keep the top-p% prompts by reward std,
    uncertainty-based filtering). Ties keep the lower group index first.
    """
    if not 0 < keep_fraction <= 1:
        raise ConfigError(f"keep_fraction must be in (0, 1], got {keep_fraction!r}")
    scores = np.asarray(scores, dtype=np.float64)
    dense, g = _dense(group)
    st = group_stats(scores, dense, g)
    k = int(np.ceil(keep_fraction * g))
    order = np.lexsort((np.arange(g), -st.std))  # std descending, then index
    keep_group = np.zeros(g, dtype=bool)
    keep_group[order[:k]] = True
    kept = np.flatnonzero(keep_group[dense])
    return Selection(kept, {
        "learn/filter_top_std_groups_kept": float(k),
        "learn/filter_top_std_groups_dropped": float(g - k),
        "learn/filter_top_std_min_kept_std": float(st.std[keep_group].min()) if k else 0.0,
    })


def overlong_filter(truncated: np.ndarray, lengths: np.ndarray | None = None,
                    max_length: int | None = None) -> Selection:
    """Drop truncated trajectories, and those longer than `max_length` tokens if given.

    Source: DAPO, arXiv 2503.14476, §3.4 (overlong filtering: a cut-off answer's reward is
    noise about its reasoning, so its loss is masked).
    """
    drop = np.asarray(truncated, dtype=bool).copy()
    long = np.zeros_like(drop)
    if max_length is not None:
        if lengths is None:
            raise ConfigError("overlong_filter with max_length needs the per-trajectory lengths")
        long = np.asarray(lengths) > max_length
    kept = np.flatnonzero(~(drop | long))
    return Selection(kept, {
        "learn/filter_truncated_dropped": float(drop.sum()),
        "learn/filter_overlong_dropped": float((long & ~drop).sum()),
    })


def rejection_sampling(scores: np.ndarray, group: np.ndarray, *, threshold: float,
                       per_group: int | None = None) -> Selection:
    """Keep trajectories with score >= threshold, at most `per_group` best per group.

    The data selection of rejection-sampling fine-tuning (RFT; Yuan et al., arXiv
    2308.01825); train on the kept rows with `taurl.train.objectives.sft_loss`.
    """
    if per_group is not None and per_group < 1:
        raise ConfigError(f"per_group must be >= 1 or None, got {per_group!r}")
    scores = np.asarray(scores, dtype=np.float64)
    dense, _ = _dense(group)
    ok = scores >= threshold
    if per_group is not None:
        # rank inside the group by score, best first (ties: lower row first); the rows that
        # pass the threshold are exactly the group's best, so "rank < per_group" caps them
        order = np.lexsort((np.arange(scores.size), -scores, dense))
        d = dense[order]
        rank = np.empty(scores.size, dtype=np.int64)
        rank[order] = np.arange(scores.size) - np.searchsorted(d, d, side="left")
        ok &= rank < per_group
    kept = np.flatnonzero(ok)
    return Selection(kept, {"learn/filter_rft_kept": float(kept.size),
                            "learn/filter_rft_dropped": float(scores.size - kept.size)})


def preference_pairs(scores: np.ndarray, group: np.ndarray, *, min_margin: float = 0.0,
                     mode: str = "best_worst") -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """(chosen, rejected) row indices for trajectory-pair DPO, within each group.

    mode="best_worst": one pair per group, its best vs its worst trajectory; mode="all":
    every pair (i, j) of the group with S_i − S_j > min_margin. Groups whose spread is not
    above `min_margin` give no pair.
    """
    if mode not in ("best_worst", "all"):
        raise ConfigError(f"preference pair mode must be 'best_worst' or 'all', got {mode!r}")
    scores = np.asarray(scores, dtype=np.float64)
    dense, g = _dense(group)
    chosen: list[int] = []
    rejected: list[int] = []
    for k in range(g):
        rows = np.flatnonzero(dense == k)
        if mode == "best_worst":
            best, worst = rows[np.argmax(scores[rows])], rows[np.argmin(scores[rows])]
            if scores[best] - scores[worst] > min_margin:
                chosen.append(int(best))
                rejected.append(int(worst))
        else:
            for i in rows:
                for j in rows:
                    if scores[i] - scores[j] > min_margin:
                        chosen.append(int(i))
                        rejected.append(int(j))
    stats = {"learn/dpo_pairs": float(len(chosen))}
    return np.array(chosen, dtype=np.int64), np.array(rejected, dtype=np.int64), stats
