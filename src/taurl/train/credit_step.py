"""The credit step of one RL update: which rows the policy step trains on, with what advantage.

    assigned = learner.assign(trajs)      # invalid rows out, the critic's V(s_t), the estimator
    kept     = filter_rows(assigned)      # groups whose advantages are all 0 teach nothing (DAPO)
    critic.update(valid, values, returns) # the critic's own fit, on every valid row, kept or not
    → Credited(kept, advantages, stats, skip)

It is a step of its own, before `Learner.update` and outside it: the recipe's one RL step
(`taurl.recipe.rl_step`) runs it for the synchronous loop and the async learner process
alike, so a reader sees the estimator, the filter and the critic's fit where they happen,
and `Learner.update` only turns the credited rows into one optimizer step.
`Learner.update(trajs)` without a credit still runs this step first (older callers).

Why the filter runs on the advantages actually trained on, not the rewards: a GiGPO group
of one outcome whose paths differ keeps its step-level signal (`zero_advantage_filter`).
Why the critic fits here: it learns from every valid row, and in its warm-up updates
(``critic_warmup_updates``) its values are not fitted yet, so no policy step may follow
(``learn/critic_warmup`` 1, ``learn/skipped`` 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from taurl.credit import Credit, TurnBatch, zero_advantage_filter
from taurl.data.trajectory import Trajectory

if TYPE_CHECKING:
    from taurl.train.learner import Learner


@dataclass(frozen=True)
class Assigned:
    """Credit of the valid trajectories of one batch (before the zero-advantage filter)."""

    trajs: list[Trajectory]  # the valid trajectories, in order
    batch: TurnBatch  # their per-turn view (with the critic's values when the estimator needs them)
    credit: Credit
    dropped: int  # invalid trajectories left out


@dataclass(frozen=True)
class Credited:
    """The credit step's answer: the rows one policy step trains on (`Learner.update`'s input)."""

    kept: list[Trajectory]  # the valid trajectories the zero-advantage filter kept, in order
    advantages: np.ndarray  # (len(kept), turns): their per-turn advantages
    stats: dict[str, float]  # the estimator's, the filter's and the critic's metrics, learn/rows
    skip: bool  # no policy step follows: nothing kept, or a critic warm-up update


def filter_rows(a: Assigned, drop_zero_variance: bool = True
                ) -> tuple[list[Trajectory], np.ndarray, dict[str, float]]:
    """The rows of `a` kept by the zero-advantage filter (all of them when it is off), their
    advantages and the credit's stats (``learn/invalid_samples_dropped`` included)."""
    stats = {**a.credit.stats, "learn/invalid_samples_dropped": float(a.dropped)}
    keep = np.arange(len(a.trajs))
    if drop_zero_variance:
        sel = zero_advantage_filter(a.credit.advantages, a.batch.turn_mask, a.batch.group,
                                    a.batch.scores)
        stats.update(sel.stats)
        keep = sel.kept
    return [a.trajs[i] for i in keep], a.credit.advantages[keep], stats


def credit_step(learner: Learner, trajs: Sequence[Trajectory]) -> Credited:
    """Assign → filter → critic fit for `trajs` (all of one or more complete groups)."""
    assigned = learner.assign(trajs)
    if assigned is None:  # no valid trajectory: nothing to credit
        return Credited([], np.zeros((0, 0)), {"learn/invalid_samples_dropped": float(len(trajs)),
                                               "learn/rows": 0.0, "learn/skipped": 1.0}, True)
    kept, adv, stats = filter_rows(assigned, learner.config.drop_zero_variance)
    critic = learner.critic
    if critic is not None and assigned.credit.returns is not None \
            and assigned.batch.values is not None:
        warming = critic.updates < learner.config.critic_warmup_updates  # before this one counts
        stats.update(critic.update(assigned.trajs, assigned.batch.values, assigned.credit.returns))
        if warming:  # the values are not fitted yet: no policy step on their advantages
            return Credited([], adv[:0], {**stats, "learn/rows": 0.0, "learn/skipped": 1.0,
                                          "learn/critic_warmup": 1.0}, True)
    stats["learn/rows"] = float(len(kept))
    if not kept:  # every group had equal rewards (or was invalid): nothing to learn, no step
        stats["learn/skipped"] = 1.0
    return Credited(kept, adv, stats, not kept)
