"""The agent loop's episode budgets and sampling, with the one set of budget defaults.

`taurl.recipe.config`'s TrainConfig (``taurl train``) and RolloutRunConfig (``taurl
rollout``) take their budget defaults from `RolloutConfig`; this module imports nothing
heavy, so a config loads without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from taurl.rollout.options import CompactionConfig  # a plain record: no torch


@dataclass(frozen=True)
class RolloutConfig:
    """Budgets and sampling for the agent loop (`taurl.rollout.loop`)."""

    max_turns: int = 3  # actions per episode (the env may have a smaller budget)
    max_action_tokens: int = 48  # sampled tokens per action
    max_episode_tokens: int = 128  # sampled tokens per episode, all actions together
    max_observation_tokens: int = 256  # an observation is cut to this many tokens
    observation_keep_tail: int = 4  # ...keeping its last ids (the closing tags)
    max_context: int = 1024  # prompt + actions + observations (never above the model's)
    max_tool_calls: int | None = None  # tool calls per episode (None: no budget)
    temperature: float = 1.0
    top_p: float = 1.0
    # an engine call that takes longer ends the episode as an error (None: wait)
    generate_timeout_s: float | None = 600.0
    # an action cut by pause("abort") (a weight update) continues on the new weights
    resume_aborted: bool = False
    # context management: a new token stream instead of a full context
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
