"""Experience replay (expiry by policy-version age and env version) and the curriculum."""

from __future__ import annotations

import dataclasses

import pytest

from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.envs.core import Task
from taurl.recipe.config import TrainConfig
from taurl.recipe.curriculum import Curriculum, CurriculumConfig, curriculum_problems, quotas
from taurl.recipe.mixing import BatchMix
from taurl.recipe.replay import ReplayBuffer, ReplayConfig, replay_problems


def _ep(
    update: int, task: str, g: int, reward: float, version: int, env_version: str = "1"
) -> Trajectory:
    return Trajectory(
        episode_id=f"r{update:04d}-{task}-{g:02d}",
        run_id="run",
        task_id=task,
        group_id=f"r{update:04d}:{task}",
        split="train",
        env_name="toy-v0",
        env_version=env_version,
        seed=g,
        segments=(Segment("prompt", (5, 6)), Segment("action", (7, 8), (-0.5, -0.5), version)),
        turns=(Turn(0, "a", {"kind": "answer"}, "", 1, None, "eos"),),
        messages=({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}),
        terminated=True,
        truncated=False,
        stop_reason=StopReason.ANSWERED,
        reward=reward,
    )


def _batch(update: int, version: int, tasks=("a", "b"), rewards=(1.0, 0.0), env_version: str = "1"):
    return [
        _ep(update, t, g, r, version, env_version) for t in tasks for g, r in enumerate(rewards)
    ]


# --- replay ---------------------------------------------------------------------------


def test_replay_mixes_whole_stored_groups_of_earlier_versions():
    buf = ReplayBuffer(ReplayConfig(capacity=8, max_age=2, fraction=0.5), seed=0)
    assert buf.store(_batch(1, 1)) == 2
    fresh = _batch(2, 2, tasks=("c", "d"))
    train, st = buf.mix(fresh, update=2, version=2)
    assert train[:4] == fresh and len(train) == 6  # ceil(0.5 · 2 groups) = 1 whole group of 2
    replayed = train[4:]
    assert len({t.group_id for t in replayed}) == 1 and replayed[0].group_id.startswith("r0001:")
    assert (
        st["replay/groups"] == 1
        and st["replay/age_max"] == 1
        and st["replay/share"] == pytest.approx(2 / 6)
    )
    # the draw is fixed by (seed, update): the same buffer and update draw the same group
    again = ReplayBuffer(ReplayConfig(capacity=8, max_age=2, fraction=0.5), seed=0)
    again.store(_batch(1, 1))
    assert again.mix(fresh, update=2, version=2)[0] == train


def test_replay_stores_only_groups_with_reward_spread():
    buf = ReplayBuffer(ReplayConfig(), seed=0)
    assert buf.store(_batch(1, 1, rewards=(1.0, 1.0))) == 0
    assert buf.store(_batch(1, 1, rewards=(1.0, 0.0))) == 2


def test_replay_expires_by_policy_version_age():
    buf = ReplayBuffer(ReplayConfig(capacity=8, max_age=2, fraction=1.0), seed=0)
    buf.store(_batch(1, 1, tasks=("a",)))
    buf.store(_batch(2, 2, tasks=("b",)))
    _, st = buf.mix(_batch(3, 3, tasks=("c",)), update=3, version=3)  # ages 2 and 1: both kept
    assert st["replay/expired_age"] == 0 and len(buf) == 2
    train, st = buf.mix(_batch(4, 4, tasks=("d",)), update=4, version=4)  # age 3 > 2: r0001 expires
    assert st["replay/expired_age"] == 1 and st["replay/expired_age_total"] == 1
    assert all(not t.group_id.startswith("r0001:") for t in train)
    assert st["replay/age_max"] <= 2


def test_replay_expires_every_group_of_another_env_version():
    buf = ReplayBuffer(ReplayConfig(capacity=8, max_age=5, fraction=1.0), seed=0)
    buf.store(_batch(1, 1, env_version="1"))
    train, st = buf.mix(_batch(2, 2, tasks=("c",), env_version="2"), update=2, version=2)
    assert st["replay/expired_env"] == 2 and st["replay/groups"] == 0 and len(train) == 2
    assert len(buf) == 0


def test_replay_capacity_evicts_the_oldest_group_first():
    buf = ReplayBuffer(ReplayConfig(capacity=2, max_age=9, fraction=1.0), seed=0)
    for u in (1, 2, 3):
        buf.store(_batch(u, u, tasks=(f"t{u}",)))
    assert list(buf.groups) == ["r0002:t2", "r0003:t3"] and buf.evicted == 1


def test_replay_and_curriculum_options_are_checked():
    assert replay_problems({}) == [] and curriculum_problems({}) == []
    assert "max_age must be >= 1" in replay_problems({"max_age": 0})[0]
    assert "unknown option" in replay_problems({"size": 3})[0]
    assert "fraction must be in (0, 1]" in replay_problems({"fraction": 1.5})[0]
    assert "summing to 1" in curriculum_problems({"mix": [0.5, 0.5, 0.5]})[0]
    assert "hard < easy" in curriculum_problems({"easy": 0.2, "hard": 0.5})[0]
    # reported by the config with every other problem, before any work
    problems = TrainConfig(
        replay={"max_age": 0}, curriculum={"easy": 2}, step_scorer="prm"
    ).problems()
    assert any("replay: max_age" in p for p in problems) and any(
        "curriculum:" in p for p in problems
    )
    assert any("step_scorer must be" in p for p in problems)


# --- curriculum -----------------------------------------------------------------------


def _tasks(n: int) -> list[Task]:
    return [Task(f"t{i}", "q", ("a",), "train", "toy-v0") for i in range(n)]


def test_quotas_split_by_the_mix_and_pass_on_what_a_bucket_cannot_fill():
    assert quotas(10, (0.3, 0.5, 0.2), (10, 10, 10)) == [3, 5, 2]
    assert quotas(10, (0.3, 0.5, 0.2), (1, 10, 0)) == [1, 9, 0]
    assert quotas(10, (0.3, 0.5, 0.2), (5, 2, 9)) == [5, 2, 3]


def test_curriculum_buckets_tasks_by_online_success_rate():
    pool = _tasks(12)
    cur = Curriculum(CurriculumConfig(mix=(0.3, 0.5, 0.2), easy=0.8, hard=0.2), pool, seed=0)
    # t0..t3 always solved, t4..t7 never, t8..t11 half: easy, hard, medium
    cur.observe([_ep(1, f"t{i}", g, 1.0 if i < 4 else 0.0 if i < 8 else float(g % 2), 1)
                 for i in range(12) for g in range(4)])
    assert [cur.bucket(f"t{i}") for i in (0, 5, 9)] == ["easy", "hard", "medium"]
    tasks, st = cur.draw(10, update=2)
    ids = [t.task_id for t in tasks]
    assert len(set(ids)) == 10  # never one task twice in a batch
    # quotas [3, 5, 2]; only 4 medium tasks, so medium's unused 1 goes to easy
    # (medium, easy, hard order)
    assert sum(cur.bucket(i) == "easy" for i in ids) == 4 == st["curriculum/easy"]
    assert sum(cur.bucket(i) == "medium" for i in ids) == 4 == st["curriculum/medium"]
    assert sum(cur.bucket(i) == "hard" for i in ids) == 2 == st["curriculum/hard"]
    assert st["curriculum/pool_easy"] == 4 and st["curriculum/unseen"] == 0
    # seeded by update
    assert cur.draw(10, update=2)[0] == tasks and cur.draw(10, update=3)[0] != tasks


def test_unseen_tasks_are_medium():
    cur = Curriculum(CurriculumConfig(min_seen=2), _tasks(4), seed=0)
    cur.observe([_ep(1, "t0", 0, 1.0, 1)])  # seen once < min_seen
    assert cur.bucket("t0") == "medium" and cur.draw(2, 1)[1]["curriculum/unseen"] == 3


# --- the recipe's hook ------------------------------------------------------------------


def test_both_off_the_batch_plan_is_the_identity(tmp_path):
    from taurl.data.ledger import Ledger

    with Ledger(tmp_path / "l.db") as ledger:
        mix = BatchMix.start(TrainConfig(), _tasks(4), 0, ledger, "run", 1, 1)
        default, fresh = _tasks(2), _batch(1, 1)
        assert mix.tasks(1, default) == (default, {})
        assert mix.batch(fresh, 1, 1) == (fresh, {})


def test_a_resumed_run_rebuilds_the_same_buffer_and_rates_from_the_ledger(tmp_path):
    from taurl.data.ledger import Ledger

    cfg = dataclasses.replace(TrainConfig(), replay={"capacity": 8, "max_age": 2, "fraction": 1.0},
                              curriculum={"mix": [0.3, 0.5, 0.2]})
    pool = [Task(t, "q", ("a",), "train", "toy-v0") for t in ("a", "b", "c", "d")]
    with Ledger(tmp_path / "l.db") as ledger:
        live = BatchMix.start(cfg, pool, 0, ledger, "run", 1, 1)
        for u in (1, 2, 3):
            fresh = _batch(u, u, tasks=("a", "b") if u % 2 else ("c", "d"))
            ledger.append_many(fresh)
            live.batch(fresh, u, u)
            live.observe(fresh)
        resumed = BatchMix.start(cfg, pool, 0, ledger, "run", 4, 1)
        assert list(resumed.replay.groups) == list(live.replay.groups)
        assert resumed.curriculum.seen == live.curriculum.seen
        assert resumed.tasks(4, pool[:2]) == live.tasks(4, pool[:2])
        fresh = _batch(4, 4, tasks=("a", "c"))
        assert resumed.batch(fresh, 4, 4) == live.batch(fresh, 4, 4)
