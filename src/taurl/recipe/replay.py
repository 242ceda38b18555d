"""Experience replay with expiry: stored groups of earlier updates mixed into each RL batch.

    replay: {capacity: 32, max_age: 2, fraction: 0.25}

    at update u, policy version v, fresh batch B (all of version v):
      expire: drop every stored group sampled by version v_g < v − max_age      (policy-version age)
              drop every stored group whose env_version differs from B's         (the env changed)
      mix:    k = ceil(fraction · groups(B)) stored groups, drawn uniformly without replacement
              with a generator seeded by (seed, u); the learner trains on B + those k groups
      store:  B's informative groups (outcome scores not all equal) after the update, FIFO
              beyond `capacity` groups (the oldest go first, counted as evicted)

Whole groups are replayed, never single episodes: group-relative estimators compare the
members of one group, and a group keeps its own ``group_id`` (``r<u>:<task>``), so a
replayed group never merges with a fresh group of the same task. Only groups with outcome
spread are stored: a group of equal rewards has zero group-relative advantage and would be
filtered out of the loss anyway.

Replayed episodes are off-policy (sampled by versions v − max_age … v − 1). The PPO ratio
π_θ / π_old uses the behaviour logprobs each episode recorded, so the clip bounds how far
they can move the policy; ``objective: decoupled_ppo`` is the loss made for such data.
Replay's metrics (``replay/*``) count what was mixed in, its age, and what expired; the
fresh batch alone feeds ``rollout/*``.

Resume: the buffer is rebuilt from the ledger (the stored episodes of the earlier updates,
in update order, through the same expire/store steps), so a restarted run mixes in the
same groups as an uninterrupted one.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from taurl.data.trajectory import Trajectory
from taurl.errors import ConfigError
from taurl.rollout.seeds import episode_seed


@dataclass(frozen=True)
class ReplayConfig:
    """The config's ``replay:`` options."""

    capacity: int = 32  # stored groups at most (FIFO)
    # a group sampled by version v_g is replayed while the policy is at v <= v_g + max_age
    max_age: int = 2
    # replayed groups per batch, as a share of the fresh batch's groups (rounded up)
    fraction: float = 0.25

    def problems(self) -> list[str]:
        out = []
        if self.capacity < 1:
            out.append(f"replay: capacity must be >= 1 (got {self.capacity})")
        if self.max_age < 1:
            out.append(f"replay: max_age must be >= 1 version (got {self.max_age}); the fresh "
                       "batch is age 0")
        if not 0 < self.fraction <= 1:
            out.append(f"replay: fraction must be in (0, 1] (got {self.fraction})")
        return out


def replay_problems(options: dict[str, Any]) -> list[str]:
    """Every problem with the ``replay:`` mapping ({} is off): `ReplayConfig`'s keys, types
    and ``problems()`` (`taurl.recipe.validate.option_problems`)."""
    from taurl.recipe.validate import option_problems

    return option_problems("replay", ReplayConfig, options)


@dataclass(frozen=True)
class StoredGroup:
    group_id: str
    episodes: tuple[Trajectory, ...]
    version: int  # the policy version that sampled it (its newest action segment)
    env_version: str


def groups_of(trajs: Iterable[Trajectory]) -> list[list[Trajectory]]:
    """`trajs` by group, in episode-id order (so live and rebuilt buffers agree)."""
    by: dict[str, list[Trajectory]] = {}
    for t in sorted(trajs, key=lambda t: t.episode_id):
        by.setdefault(t.group_id, []).append(t)
    return list(by.values())


def informative(group: Sequence[Trajectory]) -> bool:
    """A group whose members' rewards are not all equal (it carries a group-relative signal)."""
    return len({t.reward for t in group}) > 1


class ReplayBuffer:
    """Groups of earlier updates, with expiry by policy-version age and env version (module
    docstring)."""

    def __init__(self, config: ReplayConfig, seed: int):
        if problems := config.problems():
            raise ConfigError(problems)
        self.config = config
        self.seed = seed
        self.groups: OrderedDict[str, StoredGroup] = OrderedDict()
        self.expired_age = 0  # groups dropped because they grew too old (cumulative)
        self.expired_env = 0  # groups dropped because the env version changed (cumulative)
        self.evicted = 0  # groups pushed out by capacity (cumulative)

    def __len__(self) -> int:
        return len(self.groups)

    def expire(self, version: int, env_version: str) -> dict[str, float]:
        """Drop groups older than `max_age` versions or of another env version; counts of this
        call."""
        age = [g for g, s in self.groups.items() if version - s.version > self.config.max_age]
        env = [g for g, s in self.groups.items() if g not in age and s.env_version != env_version]
        for g in age + env:
            del self.groups[g]
        self.expired_age += len(age)
        self.expired_env += len(env)
        return {"replay/expired_age": float(len(age)), "replay/expired_env": float(len(env))}

    def store(self, trajs: Sequence[Trajectory]) -> int:
        """Keep the informative groups of `trajs` (one update's fresh batch); returns how many."""
        kept = 0
        for group in groups_of(trajs):
            if not informative(group) or group[0].group_id in self.groups:
                continue
            versions = [v for t in group for v in t.policy_versions]
            self.groups[group[0].group_id] = StoredGroup(group[0].group_id, tuple(group),
                                                         max(versions, default=-1),
                                                         group[0].env_version)
            kept += 1
            while len(self.groups) > self.config.capacity:
                self.groups.popitem(last=False)
                self.evicted += 1
        return kept

    def mix(self, batch: Sequence[Trajectory], update: int,
            version: int) -> tuple[list[Trajectory], dict[str, float]]:
        """The training batch for `update`: `batch` plus replayed groups; and replay/* metrics."""
        env_version = batch[0].env_version if batch else ""
        stats = self.expire(version, env_version)
        n_fresh = len(groups_of(batch))
        k = min(len(self.groups), math.ceil(self.config.fraction * n_fresh))
        rng = random.Random(episode_seed(self.seed, "replay", update))
        picked = rng.sample(list(self.groups.values()), k) if k else []
        replayed = [t for g in picked for t in g.episodes]
        ages = [version - g.version for g in picked]
        stats.update({
            "replay/groups": float(k), "replay/episodes": float(len(replayed)),
            "replay/share": len(replayed) / max(len(batch) + len(replayed), 1),
            "replay/age_mean": sum(ages) / len(ages) if ages else 0.0,
            "replay/age_max": float(max(ages, default=0)),
            "replay/buffer_groups": float(len(self.groups)),
            "replay/expired_age_total": float(self.expired_age),
            "replay/expired_env_total": float(self.expired_env),
            "replay/evicted_total": float(self.evicted),
        })
        return list(batch) + replayed, stats

    def rebuild(self, history: Sequence[tuple[int, Sequence[Trajectory]]]) -> None:
        """Replay the expire/store steps of earlier updates: (policy version, fresh batch) in
        order."""
        for version, trajs in history:
            if trajs:
                self.expire(version, trajs[0].env_version)
            self.store(trajs)
