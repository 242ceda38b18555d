"""The RL loop's optional batch planner: the curriculum chooses tasks, replay mixes groups in.

    mix = BatchMix.start(cfg, pool, seed, ledger, run_id, first, v_sft)    # None-safe: both
                                                         # off is a no-op
    tasks, s1 = mix.tasks(update, default_tasks)        # curriculum: bucketed draw; else the
                                                         # plan's slice
    train, s2 = mix.batch(fresh, update, version)       # replay: fresh + stored groups; else fresh
    mix.observe(fresh)                                   # after the update: rates, buffer

With both off (the default) every call returns its input unchanged and adds no metric, so
the recipe behaves exactly as without it. On resume (`first` > 1) the state of both is
rebuilt from the ledger's episodes of updates 1 .. first−1 (`taurl.recipe.replay`,
`taurl.recipe.curriculum`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from taurl.data.ledger import Ledger
from taurl.data.trajectory import Trajectory
from taurl.envs.core import Task
from taurl.recipe.curriculum import Curriculum, curriculum_config
from taurl.recipe.replay import ReplayBuffer, ReplayConfig

_RL_ID = re.compile(r"^r(\d{4,})-")


def rl_history(ledger: Ledger, run_id: str, before: int) -> dict[int, list[Trajectory]]:
    """The stored RL episodes of updates 1 .. before−1 of `run_id`, by update, in id order."""
    out: dict[int, list[Trajectory]] = {}
    for t in ledger.iter_query(run_id=run_id, split="train", source="policy"):
        m = _RL_ID.match(t.episode_id)
        if m and int(m.group(1)) < before:
            out.setdefault(int(m.group(1)), []).append(t)
    return {u: sorted(ts, key=lambda t: t.episode_id) for u, ts in sorted(out.items())}


class BatchMix:
    def __init__(self, curriculum: Curriculum | None, replay: ReplayBuffer | None):
        self.curriculum = curriculum
        self.replay = replay

    @classmethod
    def start(cls, cfg: Any, pool: Sequence[Task], seed: int, ledger: Ledger, run_id: str,
              first: int, v_sft: int) -> BatchMix:
        cur = Curriculum(curriculum_config(cfg.curriculum), pool, seed) if cfg.curriculum else None
        rep = ReplayBuffer(ReplayConfig(**cfg.replay), seed) if cfg.replay else None
        if (cur is not None or rep is not None) and first > 1:
            for update, trajs in rl_history(ledger, run_id, first).items():
                if cur is not None:
                    cur.observe(trajs)
                if rep is not None:  # (an empty buffer is falsy: it has a length)
                    rep.rebuild([(v_sft + update - 1, trajs)])
        return cls(cur, rep)

    def tasks(self, update: int, default: list[Task]) -> tuple[list[Task], dict[str, float]]:
        if self.curriculum is None:
            return default, {}
        return self.curriculum.draw(len(default), update)

    def batch(self, fresh: list[Trajectory], update: int,
              version: int) -> tuple[list[Trajectory], dict[str, float]]:
        if self.replay is None:
            return fresh, {}
        return self.replay.mix(fresh, update, version)

    def observe(self, fresh: Sequence[Trajectory]) -> None:
        if self.curriculum is not None:
            self.curriculum.observe(fresh)
        if self.replay is not None:
            self.replay.store(fresh)
