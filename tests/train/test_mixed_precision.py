"""Mixed precision on the learner: fp32 master weights under bf16 autocast, truncated
importance sampling against a bf16 engine, activation checkpointing (taurl.train.precision)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from tests.train._tiny_lm import tiny_lm

from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.errors import ConfigError
from taurl.policy.logprobs import sequence_logprobs
from taurl.recipe.config import TrainConfig
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.mismatch import tis_stats, tis_weights
from taurl.train.objectives.offpolicy import importance_weights
from taurl.train.precision import master_dtype, precision_problems, tis_active
from taurl.train.rows import action_logprobs, make_rows

V = 64


def _traj(name: str, action: list[int], lp: list[float], reward: float) -> Trajectory:
    segs = (Segment("prompt", (5, 6, 7)), Segment("action", tuple(action), tuple(lp), 0))
    return Trajectory(episode_id=name, run_id="r", task_id="t", group_id="g", split="train",
                      env_name="toy-v0", env_version="0", seed=0, segments=segs,
                      turns=(Turn(0, "a", {"kind": "answer"}, "", 1, None, "eos"),),
                      messages=({"role": "user", "content": "q"},), terminated=True,
                      truncated=False, stop_reason=StopReason.ANSWERED, reward=reward)


def _batch(engine: torch.nn.Module) -> list[Trajectory]:
    """Four one-turn episodes of one group, behaviour logprobs from `engine` (its dtype)."""
    actions = [[10, 11, 12, 13], [20, 21], [30, 31, 32], [40, 41, 42, 43, 44]]
    out = []
    for i, a in enumerate(actions):
        lp = sequence_logprobs(engine, [5, 6, 7] + a)[3:].float().tolist()
        out.append(_traj(f"e{i}", a, lp, float(i % 2)))
    return out


# --- truncated importance sampling: the formula --------------------------------------------


def test_tis_weights_formula_by_hand():
    learner = torch.tensor([-1.0, -0.5, -2.0, -0.1])
    engine = torch.tensor([-1.0, -1.5, -1.0, -3.0])
    # ρ = exp(l − e) = [1, e, e^-1, e^2.9]; min(ρ, 2) = [1, 2, e^-1, 2]
    w = tis_weights(learner, engine, 2.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, math.exp(-1.0), 2.0]))
    assert torch.allclose(tis_weights(learner, engine, 1e9), torch.exp(learner - engine))
    # the decoupled objective's token-level truncation is this formula (one implementation of TIS)
    mask = torch.ones(1, 4)
    w2, _ = importance_weights(learner[None], engine[None], mask, level="token", mode="truncate",
                               cap=2.0)
    assert torch.allclose(w2[0], w)


def test_tis_stats_before_and_after():
    rho = torch.tensor([1.0, 0.5, 3.0, 1.0])  # one token above C = 2
    learner, engine = rho.log(), torch.zeros(4)
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])  # the last token is not an action
    s = tis_stats(learner, engine, mask, 2.0)
    assert s["mismatch/tis_weight_mean"] == pytest.approx((1 + 0.5 + 2) / 3)
    assert s["mismatch/tis_clipped_frac"] == pytest.approx(1 / 3)
    assert s["mismatch/weight_gap_before"] == pytest.approx((0 + 0.5 + 2) / 3)  # mean |ρ − 1|
    assert s["mismatch/weight_gap_after"] == pytest.approx((0 + 0 + 1) / 3)  # mean max(0, ρ − C)
    assert tis_stats(learner, engine, torch.zeros(4), 2.0) == {}


# --- options -------------------------------------------------------------------------------


def test_precision_options_are_validated():
    assert precision_problems("fp32", "auto", 2.0, False, "auto") == []
    bad = precision_problems("bf16", "maybe", 0.5, "yes", "flash", "gspo")
    assert len(bad) == 5 and "bf16-mixed" in bad[0] and "rl.tis" in bad[1]
    assert "rl.tis: on" in precision_problems("fp32", "on", 2.0, False, "auto", "gspo")[0]
    with pytest.raises(ConfigError, match="fp16-mixed needs a CUDA device"):
        Learner(tiny_lm(V), LearnerConfig(precision="fp16-mixed"))
    with pytest.raises(ConfigError, match="fp32 master weights"):
        Learner(tiny_lm(V).to(torch.bfloat16), LearnerConfig(precision="bf16-mixed"))
    # the config file's sections: train.precision, rl.tis
    cfg = TrainConfig(precision="bf16-mixed", torch_dtype="bfloat16", tis="auto")
    assert cfg.section("train").precision == "bf16-mixed" and cfg.section("rl").tis_cap == 2.0
    assert cfg.learner_config().engine_dtype == "bfloat16"
    vllm = dataclasses.replace(cfg, engine="vllm", engine_options={"server_options": {}})
    assert vllm.learner_config().engine_dtype == "float32"  # the server's dtype, not torch_dtype
    # the recipe loads the learner's copy in fp32 under mixed precision, the engine's dtype else
    assert master_dtype("bf16-mixed", "bfloat16") == torch.float32
    assert master_dtype("fp32", "bfloat16") == torch.bfloat16
    assert "train.precision fp16-mixed needs a CUDA device" in " ".join(
        dataclasses.replace(cfg, precision="fp16-mixed", device="cpu").problems())


def test_tis_is_on_by_default_only_when_dtypes_differ():
    f32, b16 = torch.float32, torch.bfloat16
    assert not tis_active("auto", "ppo", "fp32", f32, "float32")
    assert tis_active("auto", "ppo", "bf16-mixed", f32, "float32")  # bf16 autocast vs fp32 engine
    assert tis_active("auto", "ppo", "fp32", f32, "bfloat16")  # fp32 learner, bf16 engine
    assert tis_active("auto", "ppo", "bf16-mixed", f32, "bfloat16")  # autocast ≠ a bf16 model
    assert not tis_active("auto", "ppo", "fp32", b16, "bfloat16")  # the same bf16 model both sides
    assert tis_active("on", "ppo", "fp32", f32, "float32")
    assert not tis_active("off", "ppo", "fp32", f32, "bfloat16")
    assert not tis_active("auto", "gspo", "fp32", f32, "bfloat16")  # sequence ratios: not applied


# --- the update ----------------------------------------------------------------------------


def test_bf16_mixed_update_keeps_fp32_masters_and_tracks_fp32_loss():
    model = tiny_lm(V)
    batch = _batch(model)
    ref, mixed = copy.deepcopy(model), copy.deepcopy(model)
    s32 = Learner(ref, LearnerConfig(lr=1e-2)).update(batch)
    learner = Learner(mixed, LearnerConfig(lr=1e-2, precision="bf16-mixed", tis="off"))
    s16 = learner.update(batch)
    assert all(p.dtype == torch.float32 for p in mixed.parameters())  # master weights
    state = [st for st in learner.optimizer.state.values()]
    assert state and all(st["exp_avg"].dtype == torch.float32 and st["exp_avg_sq"].dtype
                         == torch.float32 for st in state)  # AdamW moments in fp32
    # the forward really ran in bf16: the learner-vs-behaviour drift is bf16 rounding, not 0
    assert s32["mismatch/abs_max"] < 1e-5 < s16["mismatch/abs_max"] < 0.1
    # a bf16 tolerance: 8 mantissa bits, relative rounding 2^-8 on O(1) logits
    assert s16["learn/loss"] == pytest.approx(s32["learn/loss"], abs=2e-2)
    assert s16["learn/grad_norm"] == pytest.approx(s32["learn/grad_norm"], rel=0.1)
    pairs = zip(model.parameters(), mixed.parameters(), strict=True)
    moved = max(float((a - b).detach().abs().max()) for a, b in pairs)
    assert moved > 1e-4  # the step happened, on the fp32 weights


def test_tis_against_a_bf16_engine_reports_before_and_after():
    model = tiny_lm(V)
    engine = copy.deepcopy(model).to(torch.bfloat16)  # the engine samples in bf16
    batch = _batch(engine)
    cfg = LearnerConfig(lr=1e-2, engine_dtype="bfloat16", tis_cap=2.0)
    learner = Learner(copy.deepcopy(model), cfg)
    assert learner.numerics.tis and learner.numerics.objective == "decoupled_ppo"
    s = learner.update(batch)
    for key in ("mismatch/tis_weight_mean", "mismatch/tis_clipped_frac",
                "mismatch/weight_gap_before", "mismatch/weight_gap_after", "learn/is_weight_mean"):
        assert key in s
    assert s["mismatch/abs_mean"] > 1e-4  # the bf16 engine's rounding is there
    assert s["mismatch/weight_gap_after"] <= s["mismatch/weight_gap_before"]
    assert s["mismatch/tis_weight_mean"] == pytest.approx(s["learn/is_weight_mean"], rel=1e-4)
    off = Learner(copy.deepcopy(model), dataclasses.replace(cfg, tis="off"))
    assert off.numerics.objective == "ppo" and "mismatch/tis_weight_mean" not in off.update(batch)


def _grads(model: torch.nn.Module, batch: list[Trajectory]) -> list[torch.Tensor]:
    rows = make_rows(batch, torch.ones(len(batch), 1).numpy(), 0)
    from taurl.train.precision import checkpointed_eval

    model.zero_grad(set_to_none=True)
    with checkpointed_eval(model):
        lp, _ = action_logprobs(model, rows)
    (lp * rows.mask).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_activation_checkpointing_gives_the_same_gradients():
    model = tiny_lm(V)
    batch = _batch(model)
    plain = _grads(model, batch)
    ckpt = copy.deepcopy(model)
    Learner(ckpt, LearnerConfig(activation_checkpointing=True, attention="sdpa"))
    layers = [m for m in ckpt.modules() if getattr(m, "gradient_checkpointing", False) is True]
    assert layers, "HF did not enable checkpointing on the decoder layers"
    calls = []

    def counting(inner):  # is the checkpointed path taken in eval mode? (HF: only when training)
        def run(*a, **k):
            calls.append(1)
            return inner(*a, **k)
        return run

    for m in layers:
        m._gradient_checkpointing_func = counting(m._gradient_checkpointing_func)
    got = _grads(ckpt, batch)
    assert calls, "the layers ran without checkpointing"
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(plain, got, strict=True))
    assert all(not m.training for m in ckpt.modules())  # eval mode restored: no dropout


def test_memory_metric_keys():
    from taurl.monitor.memory import PeakRSS

    peak = PeakRSS()
    assert peak.read_mb() > 0
    from taurl.train.precision import cuda_peak_mb

    assert cuda_peak_mb(torch.device("cpu")) == {}  # the GPU key only where there is a GPU


def test_the_loss_scaler_step_equals_the_plain_step():
    """fp16-mixed's path through `optimizer_step`: the scaled gradient is unscaled before the
    clip, so the step (and the norm reported) are the unscaled ones (a CPU scaler stands in
    for the CUDA one fp16-mixed uses)."""
    from taurl.train.optim import optimizer_step

    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = copy.deepcopy(a)
    x = torch.randn(8, 4)
    opt_a = torch.optim.AdamW(a.parameters(), lr=0.1)
    opt_b = torch.optim.AdamW(b.parameters(), lr=0.1)
    a(x).pow(2).sum().backward()
    norm_a, _ = optimizer_step(a, opt_a, 0.1, 0, grad_clip=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(b(x).pow(2).sum()).backward()
    norm_b, _ = optimizer_step(b, opt_b, 0.1, 0, grad_clip=0.5, scaler=scaler)
    assert float(norm_b) == pytest.approx(float(norm_a), rel=1e-5) and float(norm_a) > 0.5
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(a.parameters(), b.parameters(),
                                                                strict=True))
