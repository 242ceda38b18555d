"""Policy objectives: pure, per-token, masked torch losses returning ``(loss, metrics)``.

Every loss takes (B, L) tensors aligned with the token stream (`logprobs.sequence_logprobs`)
and a mask that is 1 on action tokens only, and reduces them with an explicit aggregation
mode (`aggregation`). Modules: `ppo` (clipped surrogate, asymmetric and dual clip), `gspo`,
`offpolicy` (decoupled PPO, importance weights), `kl` (k1/k2/k3, loss or reward penalty,
entropy bonus), `dpo`, `sft`, `value` (critic and value loss), `registry` (names).
"""

from taurl.policy.logits import sequence_entropy, sequence_logprobs
from taurl.train.objectives.aggregation import AGGREGATIONS, aggregate, masked_mean
from taurl.train.objectives.dpo import dpo_loss
from taurl.train.objectives.gspo import gspo_loss
from taurl.train.objectives.kl import entropy_bonus, kl_estimate, kl_loss, kl_reward_penalty
from taurl.train.objectives.offpolicy import decoupled_ppo_loss, importance_weights
from taurl.train.objectives.ppo import dual_clip_ppo_loss, ppo_clip_loss
from taurl.train.objectives.registry import (
    OBJECTIVES,
    get_objective,
    make_objective,
    objective_family,
    objective_names,
)
from taurl.train.objectives.sft import sft_loss
from taurl.train.objectives.value import ValueModel, value_loss

__all__ = [
    "AGGREGATIONS", "OBJECTIVES", "ValueModel", "aggregate", "decoupled_ppo_loss", "dpo_loss",
    "dual_clip_ppo_loss", "entropy_bonus", "get_objective", "gspo_loss", "importance_weights",
    "kl_estimate", "kl_loss", "kl_reward_penalty", "make_objective", "masked_mean",
    "objective_family",
    "objective_names", "ppo_clip_loss", "sequence_entropy", "sequence_logprobs", "sft_loss",
    "value_loss",
]
