"""The learner's options: one declaration each, shared by the Python API and the run's file.

`LearnerConfig` is what `taurl.train.learner.Learner` reads. The recipe's ``rl:`` section
(`taurl.recipe.options.RLSection`) *is* a LearnerConfig with the run's RL options added, and
its ``train:`` section inherits `LearnerNumerics`: a new learner option is one field here
(or in RLSection), and YAML, Python and the CLI flags all follow from it. This module imports
no torch, so a config can be read and checked without it (the checks import what they need).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LearnerNumerics:
    """How the learner computes (`taurl.train.precision`): the ``train:`` section's options
    that the learner reads, declared once for LearnerConfig and the recipe's train section."""

    precision: str = "fp32"  # learner: fp32 | bf16-mixed | fp16-mixed (fp32 master weights)
    activation_checkpointing: bool = False  # learner: recompute activations in the backward
    attention: str = "auto"  # learner attention kernel: auto (the model's) | sdpa | eager


# a field the run sets from another section of its file (not an option of the rl section)
def _set_by(where: str) -> dict[str, str]:
    return {"set_by": where}


@dataclass(frozen=True)
class LearnerConfig(LearnerNumerics):
    """Hyper-parameters of one policy update (GRPO + PPO clip by default).

    Each field is declared once: this class is the learner's part of the file's ``rl:``
    section (`taurl.recipe.options.RLSection` adds the run's RL options to it), its numerics
    (precision, activation_checkpointing, attention) are `LearnerNumerics` (the ``train:``
    section), and the fields marked ``set_by`` are set by the run from other sections.
    """

    # advantage estimator by name: grpo | gigpo | rloo | dr_grpo | ... (taurl.credit.ESTIMATORS)
    estimator: str = "grpo"
    # keyword options of the estimator, e.g. {"omega": 1.0}
    estimator_options: dict[str, Any] = field(default_factory=dict)
    objective: str = "ppo"  # policy loss by name: ppo | dual_clip_ppo | gspo | decoupled_ppo
    # extra keyword options of the objective
    objective_options: dict[str, Any] = field(default_factory=dict)
    eps_low: float = 0.2  # PPO clip below: ratio >= 1 - eps_low for negative advantages
    eps_high: float = 0.28  # PPO clip above ("clip-higher", DAPO): ratio <= 1 + eps_high
    # loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum |
    # seq-mean-token-sum-norm (taurl.train.objectives.AGGREGATIONS)
    aggregation: str = "token-mean"
    lr: float = 5e-4  # RL AdamW learning rate
    # optimizer steps of linear lr warm-up: step n uses lr * min(1, n / lr_warmup_steps); 0: off
    lr_warmup_steps: int = 0
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max global gradient norm
    kl_coef: float = 0.0  # β of the KL(π_θ ‖ π_ref) loss term; 0 keeps no reference model
    kl_kind: str = "k3"  # KL estimator: k1 | k2 | k3
    entropy_coef: float = 0.0  # entropy bonus coefficient (the entropy is always measured)
    # drop groups whose advantages are all zero before the loss (DAPO dynamic sampling, on the
    # advantages used; counted in learn/filter_*)
    drop_zero_variance: bool = True
    micro_batch_tokens: int = 6144  # padded tokens per micro-batch (gradient accumulation)
    epochs: int = 1  # optimizer steps on each batch (PPO epochs)
    # sampling temperature of the rollouts (logprobs are of logits / T)
    temperature: float = field(default=1.0, metadata=_set_by("rollout.temperature"))
    # C of seq-mean-token-sum-norm (Dr. GRPO): a constant, e.g. the generation budget in tokens
    norm_constant: float | None = field(default=None,
                                        metadata=_set_by("rollout.max_episode_tokens"))
    critic_lr: float = 1e-3  # AdamW learning rate of the critic (estimators that need values: gae)
    vf_clip: float | None = 0.2  # critic's PPO value-loss clip (null: plain squared error)
    critic_epochs: int = 0  # critic optimizer steps on each batch (0: `epochs`, the policy's)
    # estimator gae: the first updates fit only the critic, no policy step (its values are
    # fitted before they shape advantages; they count in the episode budget)
    critic_warmup_updates: int = 0
    # an episode of several token streams (compaction): token (each action token weighs the
    # same) | episode (each episode 1/E), taurl.train.chains
    segment_weighting: str = "token"
    tis: str = "auto"  # truncated IS min(π/μ, C) on the PG term: auto (dtypes differ) | on | off
    tis_cap: float = 2.0  # C of the TIS weight
    # the engine's dtype (policy.torch_dtype), against the learner's
    engine_dtype: str = field(default="float32", metadata=_set_by("policy.torch_dtype"))

    def problems(self) -> list[str]:
        from taurl.credit import estimator_problems, needs_values
        from taurl.errors import ConfigError
        from taurl.train import chains
        from taurl.train.objectives import make_objective, objective_family
        from taurl.train.objectives.kl import KL_ESTIMATORS

        out = estimator_problems(self.estimator, self.estimator_options)
        if self.aggregation == "seq-mean-token-sum-norm" and self.loss_norm_constant() is None:
            out.append("aggregation seq-mean-token-sum-norm needs a constant normalizer: set "
                       "norm_constant (taurl train sets it to max_episode_tokens), or "
                       "objective_options {norm_constant: C}")
        if (c := self.loss_norm_constant()) is not None and not c > 0:
            out.append(f"norm_constant must be > 0 (got {c!r})")
        if needs_values(self.estimator):
            if not self.critic_lr > 0:
                out.append(f"critic_lr must be > 0 (got {self.critic_lr!r})")
            if self.vf_clip is not None and not self.vf_clip > 0:
                out.append(f"vf_clip must be > 0 or null (got {self.vf_clip!r})")
        if isinstance(self.lr_warmup_steps, bool) or not isinstance(self.lr_warmup_steps, int) \
                or self.lr_warmup_steps < 0:
            out.append("lr_warmup_steps must be an integer >= 0 (0: no warm-up); got "
                       f"{self.lr_warmup_steps!r}")
        if self.critic_epochs < 0:
            out.append("critic_epochs must be >= 0 (0: the policy's epochs); got "
                       f"{self.critic_epochs!r}")
        warmup = self.critic_warmup_updates
        if warmup < 0 or (warmup and not needs_values(self.estimator)):
            out.append("critic_warmup_updates must be >= 0 and needs an estimator with a critic "
                       f"(gae); got {warmup!r} with estimator {self.estimator!r}")
        try:
            if objective_family(self.objective) != "policy_gradient":
                out.append(f"objective {self.objective!r} is not a policy-gradient loss; use ppo, "
                           "dual_clip_ppo, gspo or decoupled_ppo")
            else:
                make_objective(self.objective, **self._objective_kwargs())
        except ConfigError as e:
            out += e.problems
        for name in ("lr", "grad_clip", "micro_batch_tokens", "epochs", "temperature"):
            if not getattr(self, name) > 0:
                out.append(f"{name} must be > 0 (got {getattr(self, name)!r})")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            out.append("kl_coef and entropy_coef must be >= 0")
        if self.kl_kind not in KL_ESTIMATORS:
            out.append(f"kl_kind must be one of {KL_ESTIMATORS} (got {self.kl_kind!r})")
        from taurl.train.precision import precision_problems

        out += precision_problems(self.precision, self.tis, self.tis_cap,
                                  self.activation_checkpointing, self.attention, self.objective)
        return out + chains.weighting_problems(self.segment_weighting, self.aggregation)

    def loss_norm_constant(self) -> float | None:
        """The constant C of seq-mean-token-sum-norm for every loss term (objective_options win)."""
        c = self.objective_options.get("norm_constant", self.norm_constant)
        return None if c is None else float(c)

    def critic_config(self) -> Any:
        """The critic's options (a `taurl.train.critic.CriticConfig`), from this config's."""
        from taurl.train.critic import CriticConfig

        return CriticConfig(lr=self.critic_lr, vf_clip=self.vf_clip,
                            epochs=self.critic_epochs or self.epochs, grad_clip=self.grad_clip,
                            micro_batch_tokens=self.micro_batch_tokens)

    def _objective_kwargs(self) -> dict[str, Any]:
        from taurl.train.objectives import get_objective

        params = inspect.signature(get_objective(self.objective)).parameters
        base = {"eps_low": self.eps_low, "eps_high": self.eps_high, "aggregation": self.aggregation}
        if self.objective == "gspo":  # sequence-level ratios need their own (tiny) clip range
            base = {"aggregation": self.aggregation}
        # Dr. GRPO's C is one constant for the whole run, never the micro-batch's padded width
        base["norm_constant"] = self.loss_norm_constant()
        return {**{k: v for k, v in base.items() if k in params}, **self.objective_options}
