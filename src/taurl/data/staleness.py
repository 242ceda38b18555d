"""Staleness of a batch: how many versions behind the learner its episodes were sampled (pure).

An episode's age is the learner's version minus the *oldest* policy version among its
action segments (``Trajectory.policy_versions``): a partial rollout resumed on newer weights
is as old as its first action (AReaL, arXiv 2505.24298 §4: the staleness bound η is on the
version gap between the trainer and the oldest token of a sample). Episodes no policy
sampled (demonstrations: no versions) have no age and are left out.

    age_i = v_learner − min_s version(s),  s over the action segments of episode i
    mean  = Σ age_i / n;   max = max_i age_i
    p95   = the nearest-rank 95th percentile: sorted ages at rank ⌈0.95·n⌉ (1-based),
            so it is always an age some episode has (no interpolation between versions)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from taurl.data.trajectory import Trajectory
from taurl.errors import Error


@dataclass(frozen=True)
class Staleness:
    mean: float
    p95: float
    max: float
    episodes: int  # episodes with an age (demonstrations are not counted)

    def as_stats(self, prefix: str = "learn/staleness_") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in self.__dict__.items()}


def episode_age(traj: Trajectory, version: int) -> int | None:
    """`version` − the oldest version of `traj`'s actions; None when no policy sampled it."""
    versions = traj.policy_versions
    if not versions:
        return None
    age = version - versions[0]
    if age < 0:
        raise Error(f"episode {traj.episode_id} was sampled by version {versions[0]}, newer than "
                    f"the learner's version {version}: the batch belongs to another run or the "
                    "version is wrong")
    return age


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile of `values` (0 if empty).

    >>> nearest_rank([0, 0, 1, 3], 0.95), nearest_rank([0, 1, 2, 3, 4], 0.5)
    (3, 2)
    """
    if not values:
        return 0.0
    s = sorted(values)
    return s[max(1, math.ceil(q * len(s))) - 1]


def staleness_stats(trajs: Sequence[Trajectory], version: int) -> Staleness:
    """`Staleness` of `trajs` against the learner's `version` (module docstring)."""
    ages = [a for t in trajs if (a := episode_age(t, version)) is not None]
    if not ages:
        return Staleness(0.0, 0.0, 0.0, 0)
    return Staleness(sum(ages) / len(ages), float(nearest_rank(ages, 0.95)), float(max(ages)),
                     len(ages))
