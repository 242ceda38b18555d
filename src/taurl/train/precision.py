"""The learner's numerics: mixed precision, truncated importance sampling, checkpointing.

``train.precision`` picks how the learner computes:

* ``fp32`` — the weights' own dtype throughout (``policy.torch_dtype``: float32, or the
  whole model in bfloat16 as before mixed precision existed);
* ``bf16-mixed`` — the forward and backward under ``torch.autocast(dtype=bfloat16)`` (matmuls
  in bf16, softmax/norms kept in fp32 by autocast's op lists) while the weights the optimizer
  steps (the *master* weights) and AdamW's moments stay fp32 (Micikevicius et al. 2018,
  "Mixed Precision Training", arXiv 1710.03740). CPU and CUDA both run bf16 autocast;
* ``fp16-mixed`` — the same in float16 with dynamic loss scaling (``torch.amp.GradScaler``):
  fp16's 5-bit exponent underflows small gradients without it. CUDA only (refused on CPU).

The engine samples in ``policy.torch_dtype``, which may differ from the learner's compute
dtype; the behaviour logprobs μ then carry the engine's rounding and the learner's π differs
from μ even on the same weights. That gap is measured every update (``mismatch/*``,
`taurl.train.mismatch`) and, with ``rl.tis: auto`` (the default) whenever the learner's
numerics differ from the engine's (`tis_active`), corrected by truncated importance
sampling: the `decoupled_ppo` objective with token-level truncated weights
min(π_learner/μ_engine, C) (`tis_objective`; Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training"). ``train.activation_checkpointing`` and
``train.attention`` trade compute for memory on the learner (`prepare_model`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")
TIS_MODES = ("auto", "on", "off")
ATTENTIONS = ("auto", "sdpa", "eager")
_AUTOCAST = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the objectives TIS is applied to, as the decoupled objective (the same clipped surrogate)
TIS_OBJECTIVES = ("ppo", "dual_clip_ppo", "decoupled_ppo")


def precision_problems(precision: object, tis: object, tis_cap: object, checkpointing: object,
                       attention: object, objective: str = "ppo") -> list[str]:
    """Every problem with the learner's numerics options (config input; device-free checks).

    >>> precision_problems("bf16-mixed", "auto", 0.5, False, "auto")
    ['rl.tis_cap must be a number >= 1 (C of min(π/μ, C); got 0.5)']
    """
    out = []
    if precision not in PRECISIONS:
        out.append(f"train.precision must be one of {', '.join(PRECISIONS)} (got {precision!r}); "
                   "bf16-mixed keeps fp32 master weights and computes in bf16")
    if tis not in TIS_MODES:
        out.append(f"rl.tis must be one of {', '.join(TIS_MODES)} (got {tis!r}); auto corrects "
                   "when the learner's and the engine's dtypes differ")
    if isinstance(tis_cap, bool) or not isinstance(tis_cap, (int, float)) or not tis_cap >= 1:
        out.append(f"rl.tis_cap must be a number >= 1 (C of min(π/μ, C); got {tis_cap!r})")
    if not isinstance(checkpointing, bool):
        out.append(f"train.activation_checkpointing must be true or false (got {checkpointing!r})")
    if attention not in ATTENTIONS:
        out.append(f"train.attention must be one of {', '.join(ATTENTIONS)} (got {attention!r})")
    if tis == "on" and objective not in TIS_OBJECTIVES:
        out.append(f"rl.tis: on applies to {', '.join(TIS_OBJECTIVES)} (token-level weights); "
                   f"objective {objective!r} has sequence ratios: use rl.tis: off or auto")
    return out


def device_precision_problems(precision: str, device: torch.device) -> list[str]:
    """What the device cannot run: fp16 autocast is CUDA's only here (CPU: use bf16-mixed)."""
    if precision == "fp16-mixed" and device.type != "cuda":
        return ["train.precision fp16-mixed needs a CUDA device (dynamic loss scaling on GPU); "
                f"on {device.type} use bf16-mixed, which needs no loss scaling"]
    if precision == "bf16-mixed" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return ["train.precision bf16-mixed: this CUDA device has no bfloat16; use fp16-mixed"]
    return []


def run_precision_problems(cfg: Any) -> list[str]:
    """The run config's (`taurl.recipe.config.TrainConfig`) precision problems on its device."""
    from taurl.policy.device import resolve_device

    if cfg.precision == "fp32" or cfg.precision not in PRECISIONS:
        return []
    out = []
    if cfg.objective == "dpo" or cfg.teacher:
        out.append(f"train.precision {cfg.precision} applies to the RL learner; objective dpo and "
                   "rl.teacher train in the weights' dtype: use train.precision fp32")
    try:
        return out + device_precision_problems(cfg.precision, resolve_device(cfg.device))
    except Exception:  # noqa: BLE001 — a bad device string is device_problems' to report
        return out


def engine_dtype(cfg: Any) -> str:
    """The dtype the run's engine samples in (a TrainConfig): the local engine's is
    ``policy.torch_dtype``; a vLLM server started by the run has its ``server_options.dtype``
    (float32 by default). A server given by url is taken as float32: its ``--dtype`` is not
    known here (``rl.tis: on`` corrects regardless)."""
    if cfg.engine.kind == "vllm":
        return str((cfg.engine.options.get("server_options") or {}).get("dtype", "float32"))
    return cfg.policy.torch_dtype


def master_dtype(precision: str, engine_dtype: str) -> torch.dtype:
    """The dtype the learner's weights are loaded in: fp32 masters under mixed precision, else
    the engine's (``policy.torch_dtype``, one dtype for the whole model as before)."""
    return torch.float32 if precision in _AUTOCAST else _DTYPES[engine_dtype]


def tis_active(tis: str, objective: str, precision: str, weights: torch.dtype,
               engine_dtype: str) -> bool:
    """Whether truncated IS corrects the policy-gradient term (a token-level objective only):
    on, or auto and the learner's numerics differ from the engine's. A mixed-precision learner
    differs from every engine: against a pure-bf16 engine too, since autocast keeps softmax and
    norms in fp32 where the bf16 model rounds them (benchmarks/mixed_precision.py measures a
    mean |Δ log π| of ~1e-3 there, against ~1e-4 for bf16 on both sides)."""
    if tis == "off" or objective not in TIS_OBJECTIVES:
        return False
    engine = _DTYPES.get(engine_dtype, torch.float32)
    return tis == "on" or precision in _AUTOCAST or weights != engine


def tis_objective(objective: str, options: dict[str, Any],
                  cap: float) -> tuple[str, dict[str, Any]]:
    """The objective that applies TIS: PPO (or dual-clip PPO) becomes `decoupled_ppo` with
    token-level truncated weights min(π_prox/μ, C), π_prox the learner's own logprobs before the
    step. The same clipped surrogate; with μ = π_prox it is PPO exactly. A `decoupled_ppo`
    config keeps its own weight options (it already corrects)."""
    if objective == "decoupled_ppo":
        return objective, options
    extra = {"dual_clip": options.get("dual_clip", 3.0)} if objective == "dual_clip_ppo" else {}
    return "decoupled_ppo", {**options, **extra, "is_level": "token", "is_mode": "truncate",
                             "is_cap": float(cap)}


class Numerics:
    """The learner's autocast context and loss scaler for `precision` on `device`; with
    `for_learner`, whether TIS is on and the objective (and options) that applies it."""

    def __init__(self, precision: str, device: torch.device) -> None:
        self.precision = precision
        self.device = device
        self.dtype = _AUTOCAST.get(precision)
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16-mixed" else None
        self.tis = False
        self.objective, self.objective_kwargs = "ppo", {}

    @classmethod
    def for_learner(cls, model: torch.nn.Module, config: Any, prepare: bool = True) -> Numerics:
        """The numerics of a `taurl.train.learner.Learner` over `model` (its LearnerConfig):
        checks the device and the master weights' dtype, prepares the model (checkpointing,
        attention; not with `prepare` False: a driver whose ranks prepare their own copies) and
        picks the objective (`tis_objective` when `tis_active`)."""
        from taurl.errors import ConfigError

        param = next(model.parameters())
        problems = device_precision_problems(config.precision, param.device)
        if config.precision != "fp32" and param.dtype != torch.float32:
            problems.append(f"train.precision {config.precision} keeps fp32 master weights; the "
                            f"policy is {param.dtype} (load it in float32; policy.torch_dtype is "
                            "the engine's)")
        if problems:
            raise ConfigError(problems)
        out = cls(config.precision, param.device)
        if prepare:
            prepare_model(model, config.activation_checkpointing, config.attention)
        out.tis = tis_active(config.tis, config.objective, config.precision, param.dtype,
                             config.engine_dtype)
        name, kwargs = config.objective, config._objective_kwargs()
        if out.tis:
            name, kwargs = tis_objective(name, kwargs, config.tis_cap)
        out.objective, out.objective_kwargs = name, kwargs
        return out

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast in the compute dtype (a no-op context for fp32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), scaled under fp16 (the scaler unscales before clipping)."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()


def prepare_model(model: torch.nn.Module, checkpointing: bool, attention: str) -> None:
    """Activation checkpointing and the attention kernel of the learner's model (HF models).

    checkpointing: HF's ``gradient_checkpointing_enable(use_reentrant=False)`` (or its newer
    name ``activation_checkpointing_enable``): each decoder
    layer's activations are recomputed in the backward instead of stored. attention: ``sdpa``
    (torch's fused scaled_dot_product_attention) or ``eager``; ``auto`` leaves the model's.
    """
    inner = getattr(model, "module", model)  # a DDP wrapper holds the model
    inner = getattr(inner, "get_base_model", lambda: inner)()
    if attention != "auto" and hasattr(inner, "set_attn_implementation"):
        inner.set_attn_implementation(attention)
    if not checkpointing:
        return
    kwargs = {"use_reentrant": False}
    if hasattr(inner, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(inner, "gradient_checkpointing_enable"):
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        from taurl.errors import ConfigError

        raise ConfigError("train.activation_checkpointing needs an HF model "
                          "(gradient_checkpointing_enable)")


@contextlib.contextmanager
def checkpointed_eval(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) with activation checkpointing still active.

    HF checkpoints a layer only when that layer is in training mode, and the RL update runs in
    eval mode (`taurl.train.learner`: no dropout noise in the ratio). So the checkpointed layers
    alone get ``training = True`` for the forward (their own flag, not their children's:
    attention and MLP dropout stay off); without checkpointing this is a no-op.
    """
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True
              and isinstance(m, torch.nn.Module) and not m.training]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m in layers:
            m.training = False


def cuda_peak_mb(device: torch.device, reset: bool = False) -> dict[str, float]:
    """``torch.cuda.max_memory_allocated`` in MB on a CUDA `device` (empty elsewhere); with
    `reset`, start a new peak and return nothing."""
    if device.type != "cuda":
        return {}
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
        return {}
    return {"mem/learn_cuda_peak_mb": torch.cuda.max_memory_allocated(device) / 2**20}


def batch_tis_stats(batch: Any, prox: list[torch.Tensor] | None, version: int,
                    cap: float) -> dict[str, float]:
    """`taurl.train.mismatch.tis_stats` of a learner batch (its `_Batch`): epoch 0's logprobs
    (π_prox, one (B_j, L_j) tensor per micro-batch) against the engine's, on the fresh rows."""
    from taurl.train.idle import fresh_rows
    from taurl.train.mismatch import tis_stats

    if not prox:
        return {}
    keep = [(r.mask * fresh_rows([batch.views[i] for i in c], version, r.mask)[:, None]).bool()
            for r, c in zip(batch.rows, batch.chunks, strict=True)]
    lp = torch.cat([x[k] for x, k in zip(prox, keep, strict=True)])
    mu = torch.cat([r.behaviour[k] for r, k in zip(batch.rows, keep, strict=True)])
    return tis_stats(lp, mu, torch.ones_like(lp), cap)
