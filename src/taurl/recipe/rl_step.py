"""One RL step on a collected batch: credit, then update. Both schedules call it.

    credit = credit_step(learner, batch)       # assign → zero-advantage filter → critic fit
    stats  = learner.update(batch, version, credit)   # rows → logprobs → loss → AdamW step

The synchronous loop (`taurl.recipe.loop._rl_loop`) calls it in the recipe's process; the
async schedule's learner process (`taurl.recipe.schedule.learner_proc`) calls it in its own,
on a learner built by the same factory (`taurl.recipe.stages.learner_for`). So the credit an
update trains on, and its metrics (``learn/filter_zero_adv_*``, the critic's, ``learn/rows``),
are computed the same way whichever schedule runs; collection, checkpoint and serving differ
by schedule and stay in each loop.

The stages whose learner is not the policy-gradient one (online DPO: the pairs; distillation:
the valid rows and their env advantages) have their credit in ``learner.assign``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from taurl.data.trajectory import Trajectory
from taurl.train.credit_step import credit_step
from taurl.train.learner import Learner


def rl_step(learner: Any, trajs: Sequence[Trajectory], version: int) -> dict[str, float]:
    """Credit `trajs` (complete groups sampled up to `version`), then update the policy to
    version + 1; returns the learn/* metrics. ``learn/learn_s`` counts the credit step too
    (the critic's fit is part of it)."""
    t0 = time.perf_counter()
    credit = credit_step(learner, trajs) if isinstance(learner, Learner) else learner.assign(trajs)
    credit_s = time.perf_counter() - t0
    stats = learner.update(trajs, version=version, credit=credit)
    return {**stats, "learn/learn_s": stats.get("learn/learn_s", 0.0) + credit_s}
