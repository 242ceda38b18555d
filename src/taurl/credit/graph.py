"""A trajectory-graph estimator in the spirit of SALT (Li et al., arXiv 2510.20022).

The trajectories of one group are merged into a graph whose nodes are steps, i.e.
(state, action) pairs. A node's value is the mean episode score S of the trajectories that
pass through it; a step's advantage is how much better its node does than its parent, the
point where the sibling steps branched:

    Q(n)       = mean { S_i : trajectory i passes through node n }
    A_{i,t}    = (Q(n_{i,t}) − Q(parent(n_{i,t}))) / (std_g S + eps)

Two ways to merge (``merge``):

* "prefix" (default): a node is a whole prefix (s_0, a_0, …, s_t, a_t) — the group's prefix
  tree. The parent of a depth-t node is the depth-(t−1) node on the same path; the parent of
  the first step is the group root, whose value is the group mean. Q(parent) is then the
  visit-weighted mean of its children (and of trajectories that ended there).
* "state": a node is (s_t, a_t) wherever it occurs — a DAG that also merges paths that
  reach the same state differently. The parent is the state s_t, with value
  V(s) = mean S over every visit to s. A trajectory that visits a node twice counts twice.

So a step taken by every trajectory of its group (same parent, no alternative) has
A = 0, and a step found only in failed trajectories, branching off a parent that also
leads to successes, has A < 0.

Departure from SALT: SALT averages the trajectories' group-relative (GRPO) advantages over
the trajectories sharing a step; here the step is compared with its parent instead
(Q − V, as in tree search), which makes a step that had no alternative exactly 0 and
credits the branching point, not the shared prefix. Scale: the group's population std.
"""

from __future__ import annotations

import numpy as np

from taurl.credit.batch import Credit, TurnBatch
from taurl.credit.gigpo import anchor_groups
from taurl.credit.grouping import (
    advantage_stats,
    check_positive,
    group_counts,
    group_stats,
    pair_ids,
)
from taurl.errors import ConfigError


def prefix_nodes(batch: TurnBatch) -> tuple[np.ndarray, int]:
    """Dense node ids (N, T) of the prefix tree of each group; −1 on padding.

    Exact: depth by depth, a node is the triple (parent node, state, action), numbered
    with one sort per depth, so no hash of a whole path can collide.
    """
    n, t = batch.turn_mask.shape
    nodes = np.full((n, t), -1, dtype=np.int64)
    parent = batch.group.copy()  # depth −1: the group's root
    offset = 0
    for k in range(t):
        rows = np.flatnonzero(batch.turn_mask[:, k])
        if rows.size == 0:
            break
        p, s, a = parent[rows], batch.state_hash[rows, k], batch.action_hash[rows, k]
        order = np.lexsort((a, s, p))
        new = np.ones(rows.size, dtype=bool)
        new[1:] = (np.diff(p[order]) != 0) | (np.diff(s[order]) != 0) | (np.diff(a[order]) != 0)
        ids = np.empty(rows.size, dtype=np.int64)
        ids[order] = np.cumsum(new) - 1 + offset
        nodes[rows, k] = ids
        parent[rows] = ids
        offset += int(new.sum())
    return nodes, offset


def state_action_nodes(batch: TurnBatch) -> tuple[np.ndarray, int, np.ndarray, int]:
    """Dense ids (N, T) of (group, state, action) nodes and of their (group, state) parents."""
    parents, num_parents = anchor_groups(batch.group, batch.state_hash, batch.turn_mask)
    nodes, num_nodes = pair_ids(parents, batch.action_hash, batch.turn_mask)
    return nodes, num_nodes, parents, num_parents


def _node_means(score_per_turn: np.ndarray, ids: np.ndarray,
                num: int) -> tuple[np.ndarray, np.ndarray]:
    count = np.bincount(ids, minlength=num).astype(np.float64)
    return np.bincount(ids, weights=score_per_turn, minlength=num) / np.maximum(count, 1.0), count


def salt(batch: TurnBatch, *, merge: str = "prefix", scale: str = "std",
         eps: float = 1e-6) -> Credit:
    """Step advantage from the trajectory graph (formula in the module docstring)."""
    check_positive("eps", eps)
    if scale not in ("std", "none"):
        raise ConfigError(f"graph estimator scale must be 'std' or 'none', got {scale!r}")
    mask = batch.turn_mask
    scores = batch.scores
    row_score = np.broadcast_to(scores[:, None], mask.shape)[mask]
    st = group_stats(scores, batch.group, batch.num_groups)
    adv = np.zeros(mask.shape)
    if merge == "prefix":
        nodes, num = prefix_nodes(batch)
        q, count = _node_means(row_score, nodes[mask], num)
        q_turn = np.zeros(mask.shape)
        q_turn[mask] = q[nodes[mask]]
        # the parent of step t is step t-1 of the same path; of step 0, the group root
        v_turn = np.concatenate([st.mean[batch.group][:, None], q_turn[:, :-1]],
                                axis=1)[:, : mask.shape[1]]
        adv[mask] = (q_turn - v_turn)[mask]
    elif merge == "state":
        nodes, num, parents, num_parents = state_action_nodes(batch)
        q, count = _node_means(row_score, nodes[mask], num)
        v, _ = _node_means(row_score, parents[mask], num_parents)
        adv[mask] = q[nodes[mask]] - v[parents[mask]]
    else:
        raise ConfigError(f"graph estimator merge must be 'prefix' or 'state', got {merge!r}")
    if scale == "std":
        adv = adv / (st.std[batch.group][:, None] + eps)
    adv[~mask | st.zero[batch.group][:, None]] = 0.0
    shared = count[nodes[mask]] > 1 if num else np.zeros(0, bool)
    stats = {
        **group_counts(st),
        "learn/graph_nodes": float(num),
        "learn/graph_shared_step_frac": float(shared.mean()) if shared.size else 0.0,
        **advantage_stats(adv, mask),
    }
    return Credit(advantages=adv, stats=stats)
