"""Decoupled PPO end to end through the learner: behaviour μ from the record, π_prox
recomputed, options validated from the config, off-policy metrics and staleness per update."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from tests.train._tiny_lm import tiny_lm
from transformers import Qwen2ForCausalLM

from taurl.data.staleness import nearest_rank, staleness_stats
from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.errors import ConfigError, Error
from taurl.policy.logprobs import sequence_logprobs
from taurl.recipe.config import TrainConfig
from taurl.train.learner import Learner, LearnerConfig

V = 64


def _model() -> Qwen2ForCausalLM:
    return tiny_lm(V, max_positions=128)


def _traj(name: str, actions: list[tuple[list[int], list[float], int]], reward: float = 0.0,
          prompt: tuple[int, ...] = (5, 6, 7)) -> Trajectory:
    """An episode whose turns are (action ids, behaviour logprobs, version), observation-free."""
    segs = [Segment("prompt", prompt)] + [
        Segment("action", tuple(a), tuple(lp), v) for a, lp, v in actions
    ]
    turns = tuple(Turn(i, "a", {"kind": "answer"}, "", 1, None, "eos") for i in range(len(actions)))
    return Trajectory(
        episode_id=name, run_id="r", task_id="t", group_id="g", split="train", env_name="toy-v0",
        env_version="0", seed=0, segments=tuple(segs), turns=turns,
        messages=({"role": "user", "content": "q"},), terminated=True, truncated=False,
        stop_reason=StopReason.ANSWERED, reward=reward,
    )


def _on_policy(
    model, name: str, action: list[int], reward: float, shift: float = 0.0, version: int = 0
):
    """One-turn episode whose behaviour logprobs are the model's own, minus `shift` (a stale μ)."""
    prompt = [5, 6, 7]
    lp = sequence_logprobs(model, prompt + action)[len(prompt):].tolist()
    return _traj(name, [(action, [x - shift for x in lp], version)], reward)


# --- staleness ---------------------------------------------------------------------------


def test_staleness_of_hand_made_trajectories():
    # ages against learner version 5: oldest action version decides (a resumed episode 3→5 is 2 old)
    trajs = [_traj("a", [([9], [-1.0], 5)]), _traj("b", [([9], [-1.0], 3), ([9], [-1.0], 5)]),
             _traj("c", [([9], [-1.0], 4)]), _traj("d", [([9], [-1.0], 1)])]
    s = staleness_stats(trajs, 5)
    # ages [0, 2, 1, 4]: mean 7/4; nearest-rank p95 = sorted[ceil(3.8) - 1] = sorted[3] = 4
    assert (s.mean, s.p95, s.max, s.episodes) == (1.75, 4.0, 4.0, 4)
    assert staleness_stats(trajs[:3], 5).p95 == 2.0  # ages [0, 1, 2]: rank ceil(2.85) = 3
    assert staleness_stats([], 3).as_stats()["learn/staleness_max"] == 0.0
    assert nearest_rank(list(range(100)), 0.95) == 94  # rank 95 of 0..99
    with pytest.raises(Error, match="newer than the learner"):
        staleness_stats(trajs, 4)


def test_learner_reports_staleness_against_its_version():
    model = _model()
    batch = [
        _on_policy(model, "a", [10, 11, 12], 1.0, version=2),
        _on_policy(model, "b", [20, 21], 0.0, version=0),
    ]
    stats = Learner(copy.deepcopy(model), LearnerConfig(lr=1e-3)).update(batch, version=3)
    assert (stats["learn/staleness_mean"], stats["learn/staleness_max"]) == (2.0, 3.0)
    # without a version: the newest one in the batch (the synchronous pipeline's)
    stats = Learner(copy.deepcopy(model), LearnerConfig(lr=1e-3)).update(batch)
    assert stats["learn/staleness_max"] == 2.0


# --- decoupled PPO through the learner -------------------------------------------------


def _decoupled(**opts) -> LearnerConfig:
    return LearnerConfig(lr=1e-2, objective="decoupled_ppo", objective_options=opts)


def test_on_policy_decoupled_update_is_the_ppo_update():
    # μ = π_prox (behaviour logprobs are the model's own): w = 1, nothing bounded, no KL,
    # and the step is PPO's to float precision
    model = _model()
    batch = [
        _on_policy(model, "a", [10, 11, 12, 13], 1.0),
        _on_policy(model, "b", [20, 21, 22], 0.0),
    ]
    m_ppo, m_dec = copy.deepcopy(model), copy.deepcopy(model)
    s_ppo = Learner(m_ppo, LearnerConfig(lr=1e-2)).update(batch)
    s_dec = Learner(m_dec, _decoupled()).update(batch)
    assert s_dec["learn/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert s_dec["learn/is_bounded_frac"] == 0.0
    assert abs(s_dec["learn/behaviour_kl"]) < 1e-6
    assert s_dec["mismatch/abs_max"] < 1e-4
    assert s_dec["learn/pg_loss"] == pytest.approx(s_ppo["learn/pg_loss"], abs=1e-6)
    for p, q in zip(m_ppo.parameters(), m_dec.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shift,bounded", [(0.5, True), (0.2, False)])
def test_bounded_fraction_is_positive_exactly_when_weights_exceed_the_cap(shift, bounded):
    # μ recorded lower than π_prox by `shift` nats on every token: w = e^shift;
    # e^0.5 = 1.65 > cap 1.5 (all truncated), e^0.2 = 1.22 < 1.5 (none)
    model = _model()
    batch = [
        _on_policy(model, "a", [10, 11, 12], 1.0, shift),
        _on_policy(model, "b", [20, 21], 0.0, shift),
    ]
    stats = Learner(copy.deepcopy(model), _decoupled(is_cap=1.5)).update(batch)
    assert stats["learn/is_bounded_frac"] == (pytest.approx(1.0) if bounded else 0.0)
    assert stats["learn/is_weight_mean"] == pytest.approx(min(math.exp(shift), 1.5), rel=1e-4)
    assert stats["learn/is_weight_max_raw"] == pytest.approx(math.exp(shift), rel=1e-4)
    # k3 of KL(μ ‖ π_prox) with d = log π_prox − log μ = shift: e^d − 1 − d
    assert stats["learn/behaviour_kl"] == pytest.approx(math.expm1(shift) - shift, rel=1e-3)
    assert stats["mismatch/abs_mean"] == pytest.approx(shift, rel=1e-4)
    assert stats["mismatch/abs_max"] == pytest.approx(shift, rel=1e-4)


def test_masked_weights_drop_the_tokens_from_the_gradient():
    # every weight above the cap is masked: no token has a gradient, the policy does not move
    model = _model()
    batch = [
        _on_policy(model, "a", [10, 11, 12], 1.0, 1.0),
        _on_policy(model, "b", [20, 21], 0.0, 1.0),
    ]
    m = copy.deepcopy(model)
    stats = Learner(m, _decoupled(is_mode="mask", is_cap=2.0)).update(batch)
    assert stats["learn/is_bounded_frac"] == pytest.approx(1.0) and stats["learn/grad_norm"] == 0.0
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), m.parameters(), strict=True))


def test_sequence_level_weights_through_the_learner():
    # per-token w = e^0.1 on 3 tokens: sequence level e^0.3 = 1.35 > cap 1.3, geometric e^0.1 < 1.3
    model = _model()
    batch = [
        _on_policy(model, "a", [10, 11, 12], 1.0, 0.1),
        _on_policy(model, "b", [20, 21, 22], 0.0, 0.1),
    ]
    seq = Learner(copy.deepcopy(model), _decoupled(is_level="sequence", is_cap=1.3)).update(batch)
    geo = Learner(copy.deepcopy(model), _decoupled(is_level="geometric", is_cap=1.3)).update(batch)
    assert (
        seq["learn/is_bounded_frac"] == pytest.approx(1.0) and geo["learn/is_bounded_frac"] == 0.0
    )
    assert geo["learn/is_weight_mean"] == pytest.approx(math.exp(0.1), rel=1e-4)


@pytest.mark.parametrize("opts,message", [
    ({"is_level": "geometrc"}, "Did you mean 'geometric'"),
    ({"is_mode": "clip"}, "is_mode: unknown 'clip'"),
    ({"is_cap": "2"}, "is_cap must be a finite number"),
    ({"is_cap": 0}, "is_cap must be > 0"),
    ({"is_mode": "mask", "is_floor": 3.0, "is_cap": 2.0}, "must be below is_cap"),
    ({"is_floor": 0.5}, "only applies with is_mode: mask"),
    ({"is_cpa": 2.0}, "Did you mean 'is_cap'"),
])
def test_bad_importance_options_are_refused_from_the_config(opts, message):
    cfg = _decoupled(**opts)
    assert any(message in p for p in cfg.problems()), cfg.problems()
    with pytest.raises(ConfigError, match=message):
        Learner(_model(), cfg)


def test_train_config_reports_importance_option_problems_together():
    cfg = dataclasses.replace(TrainConfig(), objective="decoupled_ppo",
                              objective_options={"is_level": "seq", "is_cap": -1.0})
    problems = cfg.learner_config().problems()
    assert any("is_level" in p for p in problems) and any(
        "is_cap must be > 0" in p for p in problems
    )


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"is_level": "token", "is_mode": "truncate", "is_cap": 2.0},
        {"is_level": "sequence", "is_mode": "mask", "is_floor": 0.5, "is_cap": 2},
        {"is_level": "geometric", "is_cap": 1.5},
    ],
)
def test_the_documented_options_are_accepted(opts):
    assert _decoupled(**opts).problems() == []


@pytest.mark.parametrize("epochs", [1, 2])
def test_proximal_policy_costs_no_extra_forward_and_is_the_pre_update_policy(epochs):
    # π_prox = the weights before the update's first optimizer step; epoch 0's own forward
    # is that policy, so decoupled PPO runs exactly as many forwards as PPO, and every
    # epoch's ratio is taken against the same pre-update logprobs
    model = _model()
    batch = [
        _on_policy(model, "a", [10, 11, 12], 1.0, 0.3),
        _on_policy(model, "b", [20, 21], 0.0, 0.3),
    ]
    before = [sequence_logprobs(model, [5, 6, 7] + a)[3:] for a in ([10, 11, 12], [20, 21])]
    counts = {}
    for objective in ("ppo", "decoupled_ppo"):
        m = copy.deepcopy(model)
        calls = []
        m.register_forward_hook(lambda *_, _calls=calls: _calls.append(1))
        learner = Learner(m, dataclasses.replace(_decoupled(), objective=objective, epochs=epochs))
        olds = []
        inner = learner.loss_fn

        def spy(lp, old, *args, _inner=inner, _olds=olds, **kw):
            _olds.append(old.detach().clone())
            return _inner(lp, old, *args, **kw)

        learner.loss_fn = spy
        learner.update(batch)
        counts[objective] = len(calls)
        if objective == "decoupled_ppo":
            assert len(olds) == epochs  # one micro-batch per epoch
            # rows sorted by length: "b" (2 actions) may come first; match by length
            for old in olds:
                for ref in before:
                    n = len(ref)
                    rows = [row[row != 0][:n] for row in old if int((row != 0).sum()) == n]
                    assert rows and torch.allclose(rows[0], ref, atol=1e-5)
    assert counts["decoupled_ppo"] == counts["ppo"] == epochs


def test_mismatch_counts_only_rows_sampled_by_the_learners_own_version():
    # async: the learner trains version 3 on rows of versions 3, 2 and a partial rollout 2→3;
    # only the all-version-3 row is on-policy, so a stale μ elsewhere is not a "mismatch"
    model = _model()
    fresh = _on_policy(model, "a", [10, 11, 12], 1.0, version=3)
    stale = _on_policy(model, "b", [20, 21], 0.0, shift=0.5, version=2)
    lp = sequence_logprobs(model, [5, 6, 7, 30, 31])[3:].tolist()
    resumed = _traj("c", [([30], [lp[0] - 0.5], 2), ([31], [lp[1]], 3)], 0.0)
    stats = Learner(copy.deepcopy(model), LearnerConfig(lr=1e-3)).update(
        [fresh, stale, resumed], version=3
    )
    assert stats["mismatch/abs_max"] < 1e-4 and stats["mismatch/tokens"] == 3
    # every row older than the learner (the batch's newest is 2, the learner is at 3): none is fresh
    stats = Learner(copy.deepcopy(model), LearnerConfig(lr=1e-3)).update([stale, stale], version=3)
    assert stats["mismatch/tokens"] == 0 and stats["mismatch/abs_mean"] == 0.0
