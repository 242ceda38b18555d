"""Admission control and the consumption check of the async schedule (pure functions).

Two guards bound staleness, and both are needed:

1. *admission* (`capacity`): a producer may start a new group only while the groups
   started so far stay within η + 1 batches of the learner (AReaL's rule);
2. *consumption* (`split_fresh`): the learner checks every episode again when it takes a
   batch and never trains on one older than η versions — completion order is not start
   order (a slow group started early can finish late), so admission alone can leak.

An episode's age is ``learner version − the oldest policy version among its action
segments`` (a partial rollout has several; the oldest one counts): `taurl.data.staleness`,
which also gives the batch's mean / p95 / max.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from taurl.data import staleness
from taurl.data.staleness import episode_age
from taurl.data.trajectory import Trajectory


def capacity(*, max_concurrent: int, running: int, accepted: int, version: int, eta: int,
             batch: int, overprovision: int = 0) -> int:
    """How many new groups (or episodes) producers may start now; never below 0.

        capacity = min(max_concurrent − running, (η + v + 1)·B + k − (accepted + running))

    AReaL (Fu et al. 2025, arXiv:2505.24298: staleness-aware training, the rollout
    controller's capacity check; the formula as issue 11 states it). Units are one batch's items:
    groups here (B = tasks_per_update). ``v`` is the learner's version index (updates done
    since RL began), ``accepted`` the items finished and kept (trained, or waiting to be),
    ``running`` those in flight. Departure from the paper: ``k`` extra items
    (over-provisioning) may be in flight, so a batch can take its first B complete groups
    and leave the long tail.

    What it guarantees (tests/test_async_schedule.py checks it): after any admission,
    started items (accepted + running) ≤ (η + v + 1)·B + k, i.e. at most η + 1 batches (+ k)
    were started ahead of the v·B items the learner has consumed, and running ≤ max_concurrent.

    >>> capacity(max_concurrent=64, running=3, accepted=5, version=0, eta=1, batch=4)
    0
    >>> capacity(max_concurrent=64, running=3, accepted=5, version=1, eta=1, batch=4)
    4
    >>> capacity(max_concurrent=5, running=3, accepted=0, version=2, eta=4, batch=4)
    2
    """
    return max(0, min(max_concurrent - running,
                      (eta + version + 1) * batch + overprovision - (accepted + running)))


def group_age(group: Sequence[Trajectory], version: int) -> int:
    """The oldest episode's age (`taurl.data.staleness.episode_age`): a group is as stale as
    its stalest member; episodes without actions count as age 0."""
    return max((episode_age(t, version) or 0 for t in group), default=0)


def split_fresh(groups: Mapping[int, Sequence[Trajectory]], version: int,
                eta: int) -> tuple[list[int], list[int]]:
    """(ids of the groups whose every episode is at most `eta` versions old, ids of the others)
    — the learner's check at consumption; the second list is dropped and counted, never trained."""
    fresh, stale = [], []
    for g, trajs in groups.items():
        (fresh if group_age(trajs, version) <= eta else stale).append(g)
    return fresh, stale


def staleness_stats(trajs: Sequence[Trajectory], version: int) -> dict[str, float]:
    """Mean, p95 (nearest rank) and max age of a trained batch, as ``rollout/staleness_*``."""
    s = staleness.staleness_stats(trajs, version)
    return {"rollout/staleness_mean": s.mean, "rollout/staleness_p95": s.p95,
            "rollout/staleness_max": s.max}


def stale_token_keep(traj: Trajectory) -> list[float]:
    """Per-token loss weights that mask the stale part of a partial rollout: 1 on action
    tokens of the episode's newest version, 0 on older versions' (and on every non-action
    token, which the action mask already drops). `mask_stale: true` trains only on this."""
    versions = traj.policy_versions
    newest = versions[-1] if versions else -1
    return [1.0 if v == newest else 0.0 for v in traj.token_versions]
