"""One RL step for both schedules (`taurl.recipe.rl_step`): credit, then update.

The synchronous loop calls `rl_step` on a learner of `stages.learner_for`; the async
schedule's learner process must call the same step on a learner of the same factory. Here
the learner process's main (`learner_proc._child`, the real one, over a real pipe, in a
thread so the spies see it) trains a fixed batch from a checkpoint, and so does the sync
path; the two answers are the same metrics, the credit's included (the zero-advantage
filter's counts, the invalid rows, the critic's fit), and the child called the shared step
and factory. The batch: a group with a signal, a group of equal rewards (GRPO's filter
drops it) and an invalid episode (dropped before credit).
"""

from __future__ import annotations

import threading
from multiprocessing import Pipe

import pytest
import torch

from taurl.data.runs import RunDir
from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import build_default_policy, load_policy
from taurl.recipe import rl_step as rl_step_module
from taurl.recipe import stages
from taurl.recipe.config import TrainConfig
from taurl.recipe.schedule import learner_proc
from taurl.train.checkpoint import save_checkpoint
from taurl.train.credit_step import credit_step
from taurl.train.learner import Learner

V = 1  # the checkpoint's policy version the batch was sampled with (the SFT checkpoint)
TIMING = ("learn/learn_s", "learn/tokens_per_s")  # wall-clock: differ between any two runs


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> RunDir:
    root = tmp_path_factory.mktemp("rl_step")
    texts = ["move left", "move right", "answer 42", "the cat sat on the mat"] * 8
    model, tok = build_default_policy(texts, root / "build", size="tiny", seed=0)
    run = RunDir.create(root / "run")
    save_checkpoint(run, V, model, tok, None, phase="sft")
    return run


def _traj(model, name: str, group: str, action: list[int], reward: float,
          invalid: bool = False) -> Trajectory:
    prompt = [5, 6, 7]
    lp = sequence_logprobs(model, prompt + action)[len(prompt):].tolist()
    return Trajectory(
        episode_id=name, run_id="r", task_id=group, group_id=group, split="train",
        env_name="toy-v0", env_version="0", seed=0,
        segments=(Segment("prompt", tuple(prompt)), Segment("action", tuple(action), tuple(lp), V)),
        turns=(Turn(0, "a", {"kind": "answer"}, "", 1, None, "eos",
                    error="tool failed" if invalid else None),),
        messages=({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}),
        terminated=not invalid, truncated=invalid,
        stop_reason=StopReason.ERROR if invalid else StopReason.ANSWERED, reward=reward)


def _batch(run: RunDir) -> list[Trajectory]:
    model = load_policy(run.checkpoint(V))[0]
    return [_traj(model, "a", "g1", [10, 11, 12, 13], 1.0),
            _traj(model, "b", "g1", [20, 21, 22], 0.0),
            _traj(model, "c", "g2", [14, 15], 1.0), _traj(model, "d", "g2", [16, 17, 18], 1.0),
            _traj(model, "e", "g1", [30, 31, 32, 33], 0.0, invalid=True)]


def _sync(cfg: TrainConfig, run: RunDir, batch: list[Trajectory]) -> dict[str, float]:
    """The synchronous loop's step: its factory's learner on checkpoint V, `rl_step`."""
    torch.manual_seed(0)
    model, tok = load_policy(run.checkpoint(V))
    return rl_step_module.rl_step(stages.learner_for(cfg, run, V, model, tok, None), batch, V)


def _async(cfg: TrainConfig, run: RunDir, batch: list[Trajectory],
           monkeypatch) -> tuple[dict, list]:
    """The learner process's main on checkpoint V, sent `batch` as update 1; its answer and
    the names of the shared parts it called."""
    called: list[str] = []
    real_step, real_factory = rl_step_module.rl_step, stages.learner_for

    def step(*a, **k):
        called.append("rl_step")
        return real_step(*a, **k)

    def factory(*a, **k):
        called.append("learner_for")
        return real_factory(*a, **k)

    monkeypatch.setattr(rl_step_module, "rl_step", step)
    monkeypatch.setattr(stages, "learner_for", factory)
    monkeypatch.setattr(learner_proc, "_die_with_parent", lambda: None)  # (not this test process)
    parent, child = Pipe()
    torch.manual_seed(0)
    thread = threading.Thread(target=learner_proc._child,
                              args=(child, cfg, str(run.root), V, V, 0, {}))
    thread.start()
    try:
        assert parent.recv() == ("ready", None)
        parent.send((1, V, batch, {}))
        kind, stats = parent.recv()
        assert kind == "learned", stats
        parent.send(None)  # stop before the checkpoint: nothing is written
    finally:
        thread.join(120)
    assert not thread.is_alive()
    return stats, called


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_the_async_learner_process_runs_the_sync_loops_step_and_gets_the_same_metrics(
        run, monkeypatch, estimator):
    cfg = TrainConfig(schedule="async", estimator=estimator, lr=1e-2)
    batch = _batch(run)
    sync = _sync(cfg, run, batch)
    asyn, called = _async(cfg, run, batch, monkeypatch)
    assert called == ["learner_for", "rl_step"]  # the sync loop's factory, then its step
    # the credit step's metrics, visible in both: one invalid row; GRPO's equal-reward group
    # has zero advantages, dropped by the filter (GAE's critic, a zero head before its first
    # fit, leaves A = return ≠ 0: both groups kept)
    dropped = 1.0 if estimator == "grpo" else 0.0
    for stats in (sync, asyn):
        assert stats["learn/invalid_samples_dropped"] == 1.0
        assert stats["learn/filter_zero_adv_groups_dropped"] == dropped
        assert stats["learn/filter_zero_adv_groups_kept"] == 2.0 - dropped
        assert stats["learn/rows"] == 4.0 - 2 * dropped and stats["learn/skipped"] == 0.0
        if estimator == "gae":  # the critic's fit is part of the credit step
            assert "learn/vf_loss" in stats and "learn/vf_grad_norm" in stats
    assert sync.keys() == asyn.keys()
    assert {k: v for k, v in sync.items() if k not in TIMING} == \
        {k: v for k, v in asyn.items() if k not in TIMING}


def test_update_takes_the_credited_rows_and_runs_no_credit_of_its_own(run):
    """`Learner.update(trajs, credit=...)` trains what the credit step kept: the critic fits
    once per step (in the credit step), and `update(trajs)` alone still credits first."""
    cfg = TrainConfig(estimator="gae", lr=1e-2)
    batch = _batch(run)
    torch.manual_seed(0)
    model, tok = load_policy(run.checkpoint(V))
    learner = stages.learner_for(cfg, run, V, model, tok, None)
    assert isinstance(learner, Learner) and learner.critic is not None
    credit = credit_step(learner, batch)
    assert [t.episode_id for t in credit.kept] == ["a", "b", "c", "d"] and not credit.skip
    assert learner.critic.updates == 1
    stats = learner.update(batch, version=V, credit=credit)
    assert learner.critic.updates == 1  # no second fit inside the update
    assert stats["learn/rows"] == 4.0 and stats["learn/vf_loss"] == credit.stats["learn/vf_loss"]
    stats = learner.update(batch, version=V)  # no credit given: the step runs first, as before
    assert learner.critic.updates == 2 and stats["learn/rows"] == 4.0
