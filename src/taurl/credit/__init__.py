"""Credit assignment: pure functions from grouped trajectories to per-turn advantages.

    batch = TurnBatch.from_trajectories(trajs)          # (N, T) per-turn view
    credit = compute_advantages(batch, "gigpo", omega=1.0, gamma=0.95)
    token_adv = broadcast_to_tokens(credit.advantages, padded_token_turn_index(trajs))

Modules: `batch` (the record), `outcome` (returns, ORM, GRPO variants, RLOO, REINFORCE++),
`returns` and `gae` (discounted returns, GAE), `gigpo`, `segments`, `graph` (SALT-style),
`shaping` (process rewards), `filters` (DAPO / StarPO-S / overlong / RFT / DPO pairs),
`multiagent` (per-role baselines, zero-sum, proposer/solver),
`tokens` (turns <-> tokens), `registry` (names for the config). numpy only, no torch.
"""

from taurl.credit.batch import Credit, TurnBatch, stable_hash
from taurl.credit.filters import (
    Selection,
    overlong_filter,
    preference_pairs,
    rejection_sampling,
    top_std_groups,
    zero_advantage_filter,
    zero_variance_filter,
)
from taurl.credit.gae import gae_turns
from taurl.credit.gigpo import gigpo, gigpo_components
from taurl.credit.graph import salt
from taurl.credit.multiagent import (
    RoleBaselineEstimator,
    learnability_reward,
    proposer_solver,
    rae,
    role_baselines,
    zero_sum,
)
from taurl.credit.outcome import (
    discounted_turn_returns,
    dr_grpo,
    grpo,
    grpo_batch_std,
    orm,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)
from taurl.credit.registry import (
    ESTIMATORS,
    compute_advantages,
    estimator_names,
    estimator_problems,
    get_estimator,
    make_estimator,
    needs_values,
)
from taurl.credit.returns import discounted_returns, gae
from taurl.credit.segments import segment_grpo
from taurl.credit.shaping import score_turns, shape_process_rewards
from taurl.credit.tokens import (
    broadcast_to_tokens,
    padded_token_turn_index,
    token_turn_index,
    turn_spans,
    turn_sums,
)

__all__ = [
    "ESTIMATORS", "Credit", "Selection", "TurnBatch", "broadcast_to_tokens", "compute_advantages",
    "discounted_returns", "discounted_turn_returns", "dr_grpo", "estimator_names",
    "estimator_problems", "gae", "gae_turns",
    "get_estimator", "gigpo", "gigpo_components", "grpo", "grpo_batch_std", "make_estimator",
    "needs_values", "orm",
    "overlong_filter", "padded_token_turn_index", "preference_pairs", "reinforce_pp",
    "reinforce_pp_baseline", "rejection_sampling", "rloo", "salt", "score_turns", "segment_grpo",
    "shape_process_rewards", "stable_hash", "token_turn_index", "top_std_groups", "turn_spans",
    "turn_sums", "zero_advantage_filter", "zero_variance_filter",
    "RoleBaselineEstimator", "learnability_reward", "proposer_solver", "rae", "role_baselines",
    "zero_sum",
]
