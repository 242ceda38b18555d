"""LoRA: train low-rank adapters instead of every weight (``lora:`` in the run config, via peft).

    lora: {rank: 16, alpha: 32, dropout: 0.0, targets: all-linear}   # {}: full fine-tuning

What changes with it (docs/lora.md):
- the learner's optimizer holds the adapters' parameters only (AdamW keeps two moments per
  trained parameter: on a 135M model about 40 MB instead of 1 GB);
- SFT trains an adapter and merges it into the SFT checkpoint (a full policy, the RL base);
  RL trains a fresh adapter on that base, and every RL checkpoint holds the adapter alone
  (`taurl.policy.adapter`: peft's files plus the base's config, path and digest);
- the KL reference (``kl_coef > 0``) is the base itself, read through the same weights with
  the adapters switched off (peft's ``disable_adapter``): no second copy of the model;
- the engines serve merged weights (``W + (alpha / r) · B A``), so sampling costs what it
  costs for the plain model, and the behaviour logprobs match the learner's unmerged forward
  to float rounding (tests/train/test_lora.py bounds it at 1e-4);
- with ``schedule: async`` the learner process writes each version's adapter, and an engine
  serves an adapter only as the version its checkpoint records (`taurl.policy.adapter.
  check_served_version`), so every sampled token carries the adapter version that produced
  it (tests/test_async_lora.py recomputes them from the saved adapters).

LoRA dropout is active only in train mode: SFT uses it, the RL update runs in eval mode
(`taurl.train.learner`: no noise in the ratio), so there it is off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from taurl.errors import ConfigError
from taurl.policy.adapter import PEFT_FIX

ALL_LINEAR = "all-linear"  # peft: every linear layer but the output layer


@dataclass(frozen=True)
class LoraOptions:
    """The ``lora:`` options of a run (module docstring)."""

    rank: int = 16  # r: the adapters' inner dimension
    alpha: float = 32.0  # scale alpha / r of the adapters' output
    dropout: float = 0.0  # dropout on the adapters' input (train mode only: SFT)
    # module names to adapt (e.g. [q_proj, v_proj]) or all-linear
    targets: str | tuple[str, ...] = ALL_LINEAR

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> LoraOptions:
        if problems := lora_problems(options):
            raise ConfigError(problems)
        targets = options.get("targets", ALL_LINEAR)
        return cls(int(options.get("rank", 16)), float(options.get("alpha", 32.0)),
                   float(options.get("dropout", 0.0)),
                   targets if isinstance(targets, str) else tuple(targets))

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["targets"] = self.targets if isinstance(self.targets, str) else list(self.targets)
        return d


def lora_problems(options: dict[str, Any]) -> list[str]:
    """Why the ``lora:`` options cannot be used (empty: fine; `{}` is full fine-tuning)."""
    if not options:
        return []
    out = []
    if unknown := sorted(set(options) - {"rank", "alpha", "dropout", "targets"}):
        out.append(f"lora: unknown option(s) {unknown}; it takes rank, alpha, dropout, targets")
    rank = options.get("rank", 16)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        out.append(f"lora.rank must be an integer >= 1 (got {rank!r}); 8-64 is usual")
    alpha = options.get("alpha", 32.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        out.append(f"lora.alpha must be a number > 0 (got {alpha!r}); the adapters' scale is alpha "
                   "/ rank")
    dropout = options.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        out.append(f"lora.dropout must be in [0, 1) (got {dropout!r})")
    targets = options.get("targets", ALL_LINEAR)
    if not (targets == ALL_LINEAR or (isinstance(targets, (list, tuple)) and targets
                                       and all(isinstance(t, str) and t for t in targets))):
        out.append(f"lora.targets must be {ALL_LINEAR!r} or a non-empty list of module names such "
                   f"as [q_proj, v_proj] (got {targets!r})")
    try:
        import peft  # noqa: F401
    except ImportError:
        out.append(f"lora needs the peft package: {PEFT_FIX}")
    return out


def target_problems(targets: str | list[str] | tuple[str, ...],
                    model: torch.nn.Module) -> list[str]:
    """Which `targets` name no linear or embedding layer of `model` (a model on the meta device is
    enough)."""
    if targets == ALL_LINEAR:
        return []
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if _adaptable(m)}
    if missing := sorted(set(targets) - names):
        return [f"lora.targets {missing} name no layer of the model that LoRA adapts; it has "
                f"{sorted(names)}"]
    return []


def _adaptable(module: torch.nn.Module) -> bool:
    # what peft's LoRA adapts: Linear, Embedding, and GPT-2's Conv1D (a transposed linear layer)
    return (isinstance(module, (torch.nn.Linear, torch.nn.Embedding))
            or type(module).__name__ == "Conv1D")


def model_target_problems(options: dict[str, Any], config: Any) -> list[str]:
    """`target_problems` for a model built from its HF `config` on the meta device (no weights)."""
    if (config is None or not options or lora_problems(options)
        or options.get("targets", ALL_LINEAR) == ALL_LINEAR):
        return []
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return target_problems(options["targets"], model)


def attach(model: torch.nn.Module, options: LoraOptions, seed: int = 0) -> Any:
    """`model` with fresh adapters (peft ``get_peft_model``): only they require gradients.

    B starts at zero, so the adapted model is `model` exactly; A is drawn from a generator
    seeded by `seed` (the global RNG is left as it was), so a run is reproducible.
    """
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=options.rank, lora_alpha=options.alpha, lora_dropout=options.dropout,
                     target_modules=options.targets if isinstance(options.targets,
                                                                  str) else list(options.targets),
                     task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, cfg)


def resume(base: torch.nn.Module, checkpoint: str | Path) -> Any:
    """`base` with the (trainable) adapters saved in `checkpoint`, bit for bit."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(checkpoint), is_trainable=True)


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` carries peft adapters."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer should hold: all of them, or with LoRA the adapters'."""
    return [p for p in model.parameters() if p.requires_grad]


@contextlib.contextmanager
def base_only(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Inside, `model` computes its base's forward (adapters off): the KL reference of a LoRA
    run, read through the same weights instead of a second copy."""
    with model.disable_adapter():
        yield model


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model with the adapters folded into its weights (in place: `model` is spent)."""
    return model.merge_and_unload() if is_lora(model) else model


# ---------------------------------------------------------------------------------------
# The recipe's RL policy (taurl.recipe.loop)


def rl_policy(run: Any, version: int, base_version: int, options: LoraOptions,
              seed: int) -> tuple[Any, Any]:
    """(model, tokenizer) to train from checkpoint `version` of `run`: the base (checkpoint
    `base_version`, the SFT policy) with fresh adapters at the first update, or with the
    adapters saved in `version` when resuming."""
    from taurl.policy.model import load_policy

    base, tok = load_policy(run.checkpoint(base_version))
    if version == base_version:
        return attach(base, options, seed), tok
    return resume(base, run.checkpoint(version)), tok


def checkpoint_meta(run: Any, base_version: int, options: LoraOptions) -> dict[str, Any]:
    """The ``lora`` entry of the run's adapter checkpoints (`taurl.policy.adapter.adapter_meta`)."""
    from taurl.policy.adapter import adapter_meta

    return adapter_meta(run.root / "checkpoints", run.checkpoint(base_version), options.as_dict())


def run_problems(cfg: Any) -> list[str]:
    """Problems with a run config's ``lora:`` (a `taurl.recipe.config.TrainConfig`): the
    options, the options it does not combine with yet, and the targets against the model."""
    from taurl.credit import needs_values

    if not cfg.lora:
        return []
    out = lora_problems(cfg.lora)
    if cfg.step_scorer != "none":  # still refused: taurl.train.prm's φ deep-copies the policy
        out.append("lora runs with step_scorer: none for now: the step scorer starts as a copy of "
                   "the policy, and a copy of an adapted (peft) policy is not built or saved as a "
                   "plain model yet; drop lora or the step scorer")
    if needs_values(cfg.estimator):
        out.append(f"lora: estimator {cfg.estimator!r} builds its critic from a copy of the "
                   "policy; use a critic-free estimator (grpo, rloo, gigpo, ...) with lora, or "
                   "drop lora")
    if not out:
        out += model_target_problems(cfg.lora, _model_config(cfg))
    return out


def _model_config(cfg: Any) -> Any:
    """The HF config of the run's policy: `model`'s, or the default policy's shape (None:
    unknown)."""
    if cfg.model:
        from transformers import AutoConfig

        from taurl.policy.sources import models_home, source_kind

        # a named model already converted: its cached directory (not converted yet: unchecked here)
        named = source_kind(cfg.model) in ("registry", "cache")
        path = models_home() / cfg.model if named else Path(cfg.model)
        try:
            return AutoConfig.from_pretrained(path)
        except (OSError, ValueError):
            return None  # model_problems reports the directory
    from taurl.policy.model import tiny_config

    return tiny_config(cfg.vocab_size,
                       cfg.model_size if cfg.model_size in ("tiny", "small") else "tiny")
