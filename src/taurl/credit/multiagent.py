"""Credit for several agents in one episode: per-role baselines, zero-sum, proposer/solver groups.

A multi-agent episode (docs/multi-agent.md) leaves one record per role; ``TurnBatch.roles``,
``match_ids`` and ``env_names`` label the rows. Notation: S_i is row i's episode return
(``batch.scores``), ρ(i) its role, e(i) its env, m(i) its match (the multi-agent episode).

* **Role-conditioned baselines** (RAE; SPIRAL, Liu et al., arXiv 2506.24119, §3.3 / Alg. 1):
  one running baseline per (env, role), an exponential moving average of that role's
  returns, so a game whose first mover wins more often does not push every first-mover move
  up. It needs no group: it works with group size 1 (one match per task).

      b_{e,ρ} ← α · b_{e,ρ} + (1 − α) · S_i,     A_i = S_i − b_{e,ρ}       (update, then subtract)

  Rows are folded in batch order, so in one batch a later row of the same key sees the
  earlier rows' updates. The baselines are the state between updates: `role_baselines`
  is the pure function (state in, state out), `RoleBaselineEstimator` keeps it for the
  learner (registered as ``rae``). Departure: SPIRAL applies the advantage per token under
  its own loss; here it is per trajectory, broadcast to the turns like GRPO's.

* **Zero-sum match credit**: A_i = S_i − mean_{j ∈ m(i)} S_j. The players' advantages of one
  match sum to 0, so what one role is pushed up by the other is pushed down (a win 1 / loss
  0 game becomes ±0.5; a ±1 game stays ±1). Source: the zero-sum reward of two-player
  games, R_0(τ) + R_1(τ) = 0 (SPIRAL §3.1). It needs every player's record of the match in
  the batch (self-play): a match with one trained record gives that record 0 (counted as a
  singleton group); against a scripted opponent use ``rae``.

* **Proposer/solver grouping**: a proposer writes a task, solvers attempt it (Absolute Zero,
  Zhao et al., arXiv 2505.03335, §3.3 TRR++: a separate baseline per task type and role;
  R-Zero, arXiv 2508.05004: challenger and solver). Two levels: proposer rows are compared
  with the proposers of the same original task, solver rows with the solvers of the *same
  proposed task* (their ``group_id`` is the proposal's). Rows are grouped by (group, role),
  so a proposer and a solver never share a baseline:

      A_i = (S_i − mean_{g(i),ρ(i)} S) / (std_{g(i),ρ(i)} S + eps)          (scale="std")

  The proposer's own reward comes from its solvers (`learnability_reward`, AZR Eq. 4):
  r_propose = 1 − s̄ when 0 < s̄ < 1, else 0 (s̄: the mean solve rate of its proposal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
from taurl.errors import ConfigError

RoleKey = tuple[str, str]  # (env name, role)


def role_keys(batch: TurnBatch) -> list[RoleKey]:
    """(env, role) of every row; "" for a label the batch does not carry."""
    n = batch.num_trajectories
    envs = batch.env_names or ("",) * n
    roles = batch.roles or ("",) * n
    return list(zip(envs, roles, strict=True))


def role_baselines(
    scores: Sequence[float] | np.ndarray,
    keys: Sequence[RoleKey],
    baselines: Mapping[RoleKey, float],
    *,
    alpha: float = 0.95,
) -> tuple[np.ndarray, dict[RoleKey, float]]:
    """RAE (module docstring): the advantages (N,) and the updated baselines.

    A key seen for the first time starts from 0 (SPIRAL initialises b = 0). Pure: the
    given mapping is not changed.
    """
    check_unit("alpha", alpha)
    out = dict(baselines)
    adv = np.zeros(len(keys), dtype=np.float64)
    for i, (s, k) in enumerate(zip(np.asarray(scores, dtype=np.float64), keys, strict=True)):
        b = alpha * out.get(k, 0.0) + (1.0 - alpha) * float(s)
        out[k] = b
        adv[i] = s - b
    return adv, out


def rae(
    batch: TurnBatch, *, alpha: float = 0.95, baselines: Mapping[RoleKey, float] | None = None
) -> tuple[Credit, dict[RoleKey, float]]:
    """Role-conditioned advantages of `batch` from `baselines` (None: all 0), and the new ones."""
    adv, new = role_baselines(batch.scores, role_keys(batch), baselines or {}, alpha=alpha)
    adv2 = broadcast_rows(adv, batch.turn_mask)
    stats = {
        "learn/role_baselines": float(len(new)),
        **{f"learn/role_baseline/{e or '-'}/{r or '-'}": b for (e, r), b in sorted(new.items())},
    }
    return Credit(advantages=adv2, stats={**stats, **advantage_stats(adv2, batch.turn_mask)}), new


class RoleBaselineEstimator:
    """The ``rae`` estimator of the registry: `rae` with its baselines kept between calls.

    The learner builds its estimator once (`taurl.credit.registry.make_estimator`), so the
    baselines run across updates. They are not in the checkpoint: a resumed run starts
    them at 0 again (they converge within ~1/(1 − α) matches per role).
    """

    def __init__(self, *, alpha: float = 0.95) -> None:
        check_unit("alpha", alpha)
        self.alpha = alpha
        self.baselines: dict[RoleKey, float] = {}

    def __call__(self, batch: TurnBatch) -> Credit:
        credit, self.baselines = rae(batch, alpha=self.alpha, baselines=self.baselines)
        return credit


def _dense(labels: Sequence[str]) -> tuple[np.ndarray, int]:
    uniq, dense = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)
    return dense.astype(np.int64), len(uniq)


def zero_sum(batch: TurnBatch) -> Credit:
    """A_i = S_i − mean over the players of match m(i) (module docstring); the rows of one
    match are those with equal ``match_ids`` (a batch without them: equal ``group``)."""
    if batch.match_ids:
        match, k = _dense(batch.match_ids)
    else:
        match, k = batch.group, batch.num_groups
    adv, st = normalize_in_groups(batch.scores, match, k, scale="none")
    adv2 = broadcast_rows(adv, batch.turn_mask)
    return Credit(
        advantages=adv2, stats={**group_counts(st), **advantage_stats(adv2, batch.turn_mask)}
    )


def proposer_solver(batch: TurnBatch, *, scale: str = "std", eps: float = 1e-6) -> Credit:
    """Group-relative advantages inside (group, role) pairs (module docstring).

    scale: "std" (GRPO's normalisation, per pair) or "none" (the mean only).
    """
    check_positive("eps", eps)
    role, _ = _dense(batch.roles or ("",) * batch.num_trajectories)
    ids, k = pair_ids(batch.group, role, np.ones(batch.num_trajectories, dtype=bool))
    adv, st = normalize_in_groups(batch.scores, ids, k, scale=scale, eps=eps)
    adv2 = broadcast_rows(adv, batch.turn_mask)
    return Credit(
        advantages=adv2, stats={**group_counts(st), **advantage_stats(adv2, batch.turn_mask)}
    )


def learnability_reward(solve_rates: Sequence[float] | np.ndarray) -> np.ndarray:
    """r_propose = 1 − s̄ if 0 < s̄ < 1 else 0, per proposal (Absolute Zero, arXiv 2505.03335,
    Eq. 4): a task every solver solves, or none does, teaches nothing."""
    s = np.asarray(solve_rates, dtype=np.float64)
    if np.any((s < 0) | (s > 1)):
        raise ConfigError(f"solve rates must be in [0, 1], got {s.tolist()}")
    return np.where((s > 0) & (s < 1), 1.0 - s, 0.0)
