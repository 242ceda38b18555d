"""GiGPO: group-in-group policy optimization (Feng et al., arXiv 2505.10978).

Two nested groups. The episode group is the usual GRPO group of trajectories of one task;
inside it, an *anchor-state group* gathers every turn, from any trajectory of the group,
that acted in the same environment state. Comparing the discounted returns of those turns
says which action was better *from that state*:

    A^E_i     = (S_i − mean_g S) / F(g)                          (Eq. 3, episode level)
    G_{i,t}   = Σ_{k>=t} γ^(k−t) r_{i,k}                          (Eq. 5, step returns)
    A^S_{i,t} = (G_{i,t} − mean_{U(s)} G) / F(U(s))              (Eq. 7, anchor group U(s))
    A_{i,t}   = A^E_i + ω · A^S_{i,t}                             (Eq. 8)

F is the group's std + eps (scale="std") or 1 (scale="none"). A step that only occurs in
failed trajectories gets a lower return than its anchor-group mean, hence A^S < 0; an
anchor group whose returns are all equal (e.g. a shared final step with one outcome), or
of size one, contributes exactly 0 and is counted.

Departures: population std (ddof=0; verl-agent uses ddof=1); the episode group is one
entry per trajectory (verl-agent's default pools one entry per step); the similarity mode
clusters greedily against each cluster's first member with difflib's ratio, as
verl-agent's ``build_step_group`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from difflib import SequenceMatcher

import numpy as np

from taurl.credit.batch import Credit, TurnBatch
from taurl.credit.grouping import (
    advantage_stats,
    broadcast_rows,
    check_positive,
    check_unit,
    group_counts,
    normalize_in_groups,
    pair_ids,
)
from taurl.credit.returns import discounted_returns
from taurl.errors import ConfigError

Similarity = Callable[[str, str], float]


def anchor_groups(group: np.ndarray, state: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids (N, T) of the (episode group, state) pairs of real turns; −1 on padding."""
    return pair_ids(group[:, None], state, mask)


def sequence_ratio(a: str, b: str) -> float:
    """difflib's similarity ratio 2·matches / (len a + len b), in [0, 1]."""
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def similar_state_ids(state_text: Sequence[Sequence[str]], group: np.ndarray, mask: np.ndarray, *,
                      threshold: float, similarity: Similarity = sequence_ratio) -> np.ndarray:
    """Cluster the states of each episode group by text similarity; (N, T) cluster ids, −1 pad.

    Turns are visited row by row; each joins the first cluster (of its episode group) whose
    first member is at least `threshold` similar, else opens a new cluster. Identical texts
    always share a cluster. Cost: O(turns × clusters) similarity calls per group.
    """
    check_unit("similarity_threshold", threshold)
    n, t = mask.shape
    out = np.full((n, t), -1, dtype=np.int64)
    reps: dict[int, list[tuple[str, int]]] = {}  # episode group -> [(representative, id)]
    exact: dict[tuple[int, str], int] = {}
    next_id = 0
    for i in range(n):
        g = int(group[i])
        for k in range(int(mask[i].sum())):
            text = state_text[i][k]
            cid = exact.get((g, text))
            if cid is None:
                for rep, rid in reps.get(g, []):
                    if similarity(text, rep) >= threshold:
                        cid = rid
                        break
            if cid is None:
                cid, next_id = next_id, next_id + 1
                reps.setdefault(g, []).append((text, cid))
            exact[(g, text)] = cid
            out[i, k] = cid
    return out


def gigpo_components(batch: TurnBatch, *, gamma: float = 0.95, scale: str = "std",
                     eps: float = 1e-6, anchor: str = "exact", similarity_threshold: float = 0.9,
                     ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """The episode part A^E (N, T) and the step part A^S (N, T) of GiGPO, and their stats."""
    check_positive("eps", eps)
    if anchor == "exact":
        state = batch.state_hash
    elif anchor == "similarity":
        if batch.state_text is None:
            raise ConfigError("GiGPO anchor='similarity' needs state texts: build the batch with "
                              "TurnBatch.from_trajectories, or use anchor='exact'")
        state = similar_state_ids(batch.state_text, batch.group, batch.turn_mask,
                                  threshold=similarity_threshold)
    else:
        raise ConfigError(f"GiGPO anchor must be 'exact' or 'similarity', got {anchor!r}")
    ep, st = normalize_in_groups(batch.scores, batch.group, batch.num_groups, scale=scale, eps=eps)
    a_e = broadcast_rows(ep, batch.turn_mask)

    returns = discounted_returns(batch.turn_rewards(), batch.turn_mask, gamma)
    ids, k = anchor_groups(batch.group, state, batch.turn_mask)
    a_s = np.zeros_like(returns)
    valid = batch.turn_mask
    a_s[valid], step_st = normalize_in_groups(returns[valid], ids[valid], k, scale=scale, eps=eps)
    stats = {
        **group_counts(st),
        "learn/step_groups": float(k),
        "learn/step_groups_zero_std": float(step_st.zero.sum()),
        "learn/step_groups_singleton": float((step_st.count == 1).sum()),
        "learn/step_group_size_mean": float(step_st.count.mean()) if k else 0.0,
    }
    return a_e, a_s, stats


def gigpo(batch: TurnBatch, *, omega: float = 1.0, gamma: float = 0.95, scale: str = "std",
          eps: float = 1e-6, anchor: str = "exact", similarity_threshold: float = 0.9) -> Credit:
    """A = A^E + ω·A^S (arXiv 2505.10978, Eq. 8); see the module docstring for each part.

    gamma: discount of the step returns (the paper uses 0.95). anchor: "exact" groups turns
    with equal ``state_hash``; "similarity" groups states whose texts are at least
    `similarity_threshold` similar (difflib ratio). scale: "std" or "none" (the paper's
    F_norm = std or 1), applied at both levels.
    """
    if omega < 0:
        raise ConfigError(f"GiGPO omega (step-advantage weight) must be >= 0, got {omega!r}")
    a_e, a_s, stats = gigpo_components(batch, gamma=gamma, scale=scale, eps=eps, anchor=anchor,
                                       similarity_threshold=similarity_threshold)
    adv = np.where(batch.turn_mask, a_e + omega * a_s, 0.0)
    stats["learn/adv_step_abs_mean"] = (float(np.abs(a_s[batch.turn_mask]).mean())
                                        if batch.turn_mask.any() else 0.0)
    return Credit(advantages=adv, stats={**stats, **advantage_stats(adv, batch.turn_mask)})
