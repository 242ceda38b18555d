"""A success-rate curriculum: each RL batch's tasks drawn from easy / medium / hard buckets.

    curriculum: {mix: [0.3, 0.5, 0.2], easy: 0.8, hard: 0.2, min_seen: 2}

    rate(task) = successes / episodes of that task so far in this run's RL (reward >= 1,
                 as ``rollout/success`` counts it)
    bucket     = easy if rate >= easy, hard if rate <= hard, else medium;
                 a task seen fewer than `min_seen` times is medium (unknown difficulty)
    quotas     = the batch's `tasks_per_update` split by `mix` (largest remainder); a bucket
                 with too few tasks gives its unused quota to the others (medium first)
    draw       = tasks without replacement inside each bucket, seeded by (seed, update)

The pool is the run's RL task plan (``updates × tasks_per_update`` training tasks), so a
task can come back once its difficulty is known; a batch never holds one task twice (its
group id would merge two groups). Easy tasks keep the policy from forgetting, hard ones
are mostly zero-variance groups (no GRPO signal), so the medium middle gets half the batch
— the "learnability" argument of curriculum methods for RL on LLMs (e.g. "Self-Evolving
Curriculum", arXiv 2505.14970; DAPO's dynamic sampling keeps only groups with spread).
The mix drawn is recorded per update (``curriculum/easy|medium|hard`` tasks drawn,
``curriculum/pool_*`` bucket sizes).

Resume: the rates are rebuilt from the ledger's episodes of the earlier updates, so a
restarted run draws the same tasks (and reuses their stored episodes) as an uninterrupted one.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from taurl.data.trajectory import Trajectory
from taurl.envs.core import Task
from taurl.errors import ConfigError
from taurl.rollout.seeds import episode_seed

BUCKETS = ("easy", "medium", "hard")


@dataclass(frozen=True)
class CurriculumConfig:
    """The config's ``curriculum:`` options."""

    mix: tuple[float, ...] = (0.3, 0.5, 0.2)  # shares of easy, medium, hard tasks in each batch
    easy: float = 0.8  # a task with success rate >= easy is easy
    hard: float = 0.2  # a task with success rate <= hard is hard
    min_seen: int = 1  # episodes of a task before its rate counts (fewer: medium)

    def problems(self) -> list[str]:
        out = []
        if len(self.mix) != 3 or any(not isinstance(x, (int, float)) or x < 0 for x in self.mix) \
                or not abs(sum(self.mix) - 1.0) < 1e-6:
            out.append("curriculum: mix must be three shares >= 0 (easy, medium, hard) summing to "
                       f"1 (got {list(self.mix)})")
        if not 0 <= self.hard < self.easy <= 1:
            out.append(f"curriculum: need 0 <= hard < easy <= 1 (got hard={self.hard}, "
                       f"easy={self.easy})")
        if self.min_seen < 1:
            out.append(f"curriculum: min_seen must be >= 1 (got {self.min_seen})")
        return out


def curriculum_problems(options: dict[str, Any]) -> list[str]:
    """Every problem with the ``curriculum:`` mapping ({} is off): `CurriculumConfig`'s keys,
    types and ``problems()`` (`taurl.recipe.validate.option_problems`)."""
    from taurl.recipe.validate import option_problems

    return option_problems("curriculum", CurriculumConfig, options)


def curriculum_config(options: dict[str, Any]) -> CurriculumConfig:
    from taurl.recipe.validate import option_value

    return option_value(CurriculumConfig, options)


def quotas(n: int, mix: Sequence[float], available: Sequence[int]) -> list[int]:
    """Tasks per bucket: n split by `mix` (largest remainder), capped by `available`.

    What a bucket cannot fill goes to the others, medium first, then easy, then hard.

    >>> quotas(8, (0.3, 0.5, 0.2), (10, 10, 10))
    [2, 4, 2]
    >>> quotas(8, (0.3, 0.5, 0.2), (0, 20, 1))
    [0, 7, 1]
    """
    raw = [n * m for m in mix]
    q = [int(x) for x in raw]
    for i in sorted(range(len(mix)), key=lambda i: (-(raw[i] - q[i]), i))[: n - sum(q)]:
        q[i] += 1
    q = [min(a, b) for a, b in zip(q, available, strict=True)]
    for i in (1, 0, 2):  # the unfilled remainder: medium first
        q[i] += min(available[i] - q[i], n - sum(q))
    return q


class Curriculum:
    """Online success rates per task and the bucketed draw of each batch (module docstring)."""

    def __init__(self, config: CurriculumConfig, pool: Sequence[Task], seed: int):
        if problems := config.problems():
            raise ConfigError(problems)
        self.config = config
        self.pool = list({t.task_id: t for t in pool}.values())  # unique tasks, plan order
        self.seed = seed
        self.seen: dict[str, int] = {}
        self.successes: dict[str, int] = {}

    def observe(self, trajs: Iterable[Trajectory]) -> None:
        """Count one update's episodes (reward >= 1 is a success)."""
        for t in trajs:
            self.seen[t.task_id] = self.seen.get(t.task_id, 0) + 1
            self.successes[t.task_id] = self.successes.get(t.task_id, 0) + int(t.reward >= 1.0)

    def bucket(self, task_id: str) -> str:
        n = self.seen.get(task_id, 0)
        if n < self.config.min_seen:
            return "medium"
        rate = self.successes.get(task_id, 0) / n
        return ("easy" if rate >= self.config.easy else "hard" if rate <= self.config.hard
                else "medium")

    def draw(self, n: int, update: int) -> tuple[list[Task], dict[str, float]]:
        """`n` distinct tasks for `update`, by bucket quotas; and curriculum/* metrics."""
        if n > len(self.pool):
            raise ConfigError(
                f"curriculum: a batch of {n} tasks needs at least {n} RL tasks in the pool"
            )
        by = {b: [t for t in self.pool if self.bucket(t.task_id) == b] for b in BUCKETS}
        q = quotas(n, self.config.mix, [len(by[b]) for b in BUCKETS])
        rng = random.Random(episode_seed(self.seed, "curriculum", update))
        tasks: list[Task] = []
        for b, k in zip(BUCKETS, q, strict=True):
            tasks += rng.sample(by[b], k)
        stats = {f"curriculum/{b}": float(k) for b, k in zip(BUCKETS, q, strict=True)}
        stats.update({f"curriculum/pool_{b}": float(len(by[b])) for b in BUCKETS})
        stats["curriculum/unseen"] = float(sum(t.task_id not in self.seen for t in self.pool))
        return tasks, stats
