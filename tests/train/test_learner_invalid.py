"""Invalid samples (an error, not the agent, ended the episode) never reach the loss.

They are dropped before credit assignment, so they neither add gradient of their own nor
change their group's statistics (a tool failure is not a 0-reward rollout).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from tests.train._tiny_lm import tiny_lm
from transformers import Qwen2ForCausalLM

from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.errors import ContractError
from taurl.policy.logprobs import sequence_logprobs
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.sft import sft_step

V = 64


def _model() -> Qwen2ForCausalLM:
    return tiny_lm(V, max_positions=128)


def _traj(model, name: str, prompt: list[int], action: list[int], reward: float, group: str = "g",
          invalid: bool = False) -> Trajectory:
    """A one-turn episode whose behaviour logprobs are the model's own (on-policy)."""
    lp = sequence_logprobs(model, prompt + action)[len(prompt):].tolist()
    return Trajectory(
        episode_id=name,
        run_id="r",
        task_id=group,
        group_id=group,
        split="train",
        env_name="toy-v0",
        env_version="0",
        seed=0,
        segments=(Segment("prompt", tuple(prompt)), Segment("action", tuple(action), tuple(lp), 0)),
        turns=(
            Turn(
                0, "a", {"kind": "answer"}, "", 1, None, "eos",
                error="tool failed" if invalid else None,
            ),
        ),
        messages=({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}),
        terminated=not invalid,
        truncated=invalid,
        stop_reason=StopReason.ERROR if invalid else StopReason.ANSWERED,
        reward=reward,
    )


def _batch(model):
    a = _traj(model, "a", [5, 6, 7], [10, 11, 12, 13], 1.0)
    b = _traj(model, "b", [5, 6, 7], [20, 21, 22], 0.0)
    c = _traj(model, "c", [5, 6, 7], [30, 31, 32, 33, 34], 0.0, invalid=True)
    return a, b, c


def _updated(model, trajs, **cfg):
    m = copy.deepcopy(model)
    metrics = Learner(m, LearnerConfig(lr=1e-2, **cfg)).update(trajs)
    return m, metrics


def _same(m1, m2) -> bool:
    return all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters(), strict=True))


def test_an_invalid_sample_contributes_no_gradient_and_is_counted():
    model = _model()
    a, b, c = _batch(model)
    assert not c.valid and a.valid and b.valid
    with_invalid, m = _updated(model, [a, b, c])
    without, m0 = _updated(model, [a, b])
    # bit for bit: c reached neither the loss nor the statistics
    assert _same(with_invalid, without)
    assert m["learn/invalid_samples_dropped"] == 1.0 and m0["learn/invalid_samples_dropped"] == 0.0
    assert m["learn/rows"] == 2.0
    # the check can fail: the same episode marked valid does change the update
    c_valid = dataclasses.replace(
        c, stop_reason=StopReason.ANSWERED, terminated=True, truncated=False
    )
    assert not _same(_updated(model, [a, b, c_valid])[0], without)


def test_a_tool_failure_is_not_a_zero_reward_rollout_of_its_group():
    """Rewards [1, 1, failure]: the valid members agree, so the group carries no signal."""
    model = _model()
    a, b, c = _batch(model)
    b1 = dataclasses.replace(b, reward=1.0)
    after, m = _updated(model, [a, b1, c])
    assert m["learn/skipped"] == 1.0 and m["learn/invalid_samples_dropped"] == 1.0
    assert _same(after, model)
    # had the failure counted as reward 0, the group would have pushed a and b1 up
    c_valid = dataclasses.replace(
        c, stop_reason=StopReason.ANSWERED, terminated=True, truncated=False
    )
    assert _updated(model, [a, b1, c_valid])[1]["learn/skipped"] == 0.0


def test_a_batch_of_only_invalid_samples_takes_no_step():
    model = _model()
    _, _, c = _batch(model)
    after, m = _updated(model, [c, dataclasses.replace(c, episode_id="c2", reward=1.0)])
    assert m["learn/skipped"] == 1.0 and m["learn/invalid_samples_dropped"] == 2.0
    assert _same(after, model)


def test_sft_step_leaves_invalid_samples_out():
    model = _model()
    a, _, c = _batch(model)
    outs = []
    for trajs in ([a, c], [a]):
        m = copy.deepcopy(model)
        metrics = sft_step(m, torch.optim.AdamW(m.parameters(), lr=1e-2), trajs, pad_id=0)
        outs.append((m, metrics))
    assert _same(outs[0][0], outs[1][0]) and not _same(outs[0][0], model)
    assert outs[0][1]["sft/invalid_samples_dropped"] == 1.0
    assert outs[0][1]["sft/action_tokens"] == 4.0
    m = copy.deepcopy(model)
    skipped = sft_step(m, torch.optim.AdamW(m.parameters(), lr=1e-2), [c], pad_id=0)
    assert skipped["sft/skipped"] == 1.0 and _same(m, model)


def test_sft_step_skips_records_without_an_action_token():
    """A demonstration whose prompt alone filled the context (context_full before the first
    action: a reasoning-gym arc_agi grid in a tiny policy's 1,024 tokens) has no SFT target;
    a batch of only such records takes no step instead of failing in backward()."""
    model = _model()
    a, _, _ = _batch(model)
    empty = dataclasses.replace(
        a, episode_id="e", segments=a.segments[:1], turns=(), terminated=False, truncated=True,
        stop_reason=StopReason.CONTEXT_FULL,
    )
    m = copy.deepcopy(model)
    assert (
        sft_step(m, torch.optim.AdamW(m.parameters(), lr=1e-2), [empty], pad_id=0)["sft/skipped"]
        == 1.0
    )
    assert _same(m, model)
    m1, m2 = copy.deepcopy(model), copy.deepcopy(model)
    sft_step(m1, torch.optim.AdamW(m1.parameters(), lr=1e-2), [a, empty], pad_id=0)
    sft_step(m2, torch.optim.AdamW(m2.parameters(), lr=1e-2), [a], pad_id=0)
    assert _same(m1, m2) and not _same(m1, model)


def test_a_demonstration_in_the_rl_batch_is_refused_not_read_as_logprob_zero():
    model = _model()
    a, b, _ = _batch(model)
    demo = dataclasses.replace(a, source="expert")
    with pytest.raises(ContractError, match="behaviour_without_policy"):
        Learner(copy.deepcopy(model), LearnerConfig()).update([demo, b])
    m = copy.deepcopy(model)  # SFT on it is fine: no ratio is formed
    assert (
        sft_step(m, torch.optim.AdamW(m.parameters(), lr=1e-2), [demo], pad_id=0)["sft/skipped"]
        == 0.0
    )
