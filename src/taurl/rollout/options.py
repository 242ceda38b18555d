"""The option records of the rollout stage that a config file sets: ``rollout.compaction``
and ``sft.rejection``.

They live apart from the code that reads them (`taurl.rollout.compaction`,
`taurl.rollout.rejection`) so that a config can hold them without importing torch: a config
section holds one instance of each (`taurl.recipe.options.typed`), its file a mapping of the
same keys. Each field's comment is its documentation (docs/reference/config.md); the loader
checks unknown keys and types from the fields, ``problems()`` the ranges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("none", "drop", "truncate", "summarize", "env")
BUCKETS = ("easy", "medium", "hard")  # difficulty buckets (taurl.rollout.synth.difficulty_bucket)


@dataclass(frozen=True)
class CompactionConfig:
    """``rollout.compaction``: how the loop compacts a context that is filling up
    (`taurl.rollout.compaction`); the default, policy none, never compacts."""

    # none (a full context ends the episode) | drop | truncate | summarize | env (the env's
    # compact_prompt hook)
    policy: str = "none"
    # compact before a turn once the stream holds this share of max_context (a share: the
    # same file works for any context size)
    trigger: float = 0.8
    # drop / truncate / summarize: the last turns kept whole in the new prompt (the latest
    # exchange is what the next action answers)
    keep_turns: int = 1
    truncate_tokens: int = 8  # truncate: older observations cut to this many tokens
    summary_tokens: int = 48  # summarize: the summary's token budget
    # summarize: trained (the summary is an action, trained on) | masked (mask 0 in the loss)
    summary: str = "trained"
    # summarize: the request appended before the summary (mask 0)
    summary_request: str = "Summarize the progress so far."

    @property
    def on(self) -> bool:
        return self.policy != "none"

    def problems(self) -> list[str]:
        """The values out of range (keys and types are the loader's to check)."""
        out = []
        if self.policy not in POLICIES:
            out.append(f"rollout.compaction.policy must be one of {', '.join(POLICIES)} "
                       f"(got {self.policy!r})")
        if self.summary not in ("trained", "masked"):
            out.append(f"rollout.compaction.summary must be trained or masked "
                       f"(got {self.summary!r})")
        if not 0 < self.trigger <= 1:
            out.append("rollout.compaction.trigger must be a share of max_context in (0, 1] "
                       f"(got {self.trigger!r})")
        for k, least in (("keep_turns", 0), ("truncate_tokens", 1), ("summary_tokens", 1)):
            if getattr(self, k) < least:
                out.append(f"rollout.compaction.{k} must be >= {least} (got {getattr(self, k)})")
        return out


@dataclass(frozen=True)
class RejectionOptions:
    """``sft.rejection``: the sampling and the filters of ``sft.data: rejection``
    (`taurl.rollout.rejection`); a 0 takes the value from the RL or SFT options named."""

    # sample → filter → SFT, this many times (each round from the previous round's policy)
    rounds: int = 1
    # episodes per task (0: rl.group_size, so a round's budget is the RL updates')
    attempts: int = 0
    # tasks per round (0: rl.updates × rl.tasks_per_update / rounds: the RL budget split over
    # the rounds)
    tasks: int = 0
    temperature: float = 0.0  # sampling temperature (0: rollout.temperature)
    per_task: int = 0  # at most this many kept episodes per task (0: attempts)
    # diversity: max action-sequence Jaccard between kept episodes of one task (1: no bound)
    max_jaccard: float = 1.0
    min_action_tokens: int = 0  # lower bound on an episode's sampled tokens (0: none)
    max_action_tokens: int = 0  # upper bound on an episode's sampled tokens (0: none)
    # difficulty buckets kept (a task's verified success rate over its attempts)
    buckets: list[str] = field(default_factory=lambda: list(BUCKETS))
    lr: float = 0.0  # the rounds' SFT peak learning rate (0: sft.lr)
    epochs: int = 0  # passes over a round's kept episodes (0: sft.epochs)
    # linear warm-up steps of each round's SFT (a round is a few dozen steps)
    warmup_steps: int = 0

    def problems(self) -> list[str]:
        """The values out of range (keys and types are the loader's to check)."""
        out = []
        if self.rounds < 1:
            out.append(f"sft.rejection.rounds must be >= 1 (got {self.rounds!r})")
        for name in ("attempts", "tasks", "per_task", "min_action_tokens", "max_action_tokens",
                     "epochs", "warmup_steps"):
            if getattr(self, name) < 0:
                out.append(f"sft.rejection.{name} must be >= 0 (got {getattr(self, name)!r})")
        if self.temperature < 0:
            out.append("sft.rejection.temperature must be >= 0 (0: the rollout's; "
                       f"got {self.temperature!r})")
        if self.lr < 0:
            out.append(f"sft.rejection.lr must be >= 0 (0: sft.lr; got {self.lr!r})")
        if not 0 <= self.max_jaccard <= 1:
            out.append(f"sft.rejection.max_jaccard must be in [0, 1] (got {self.max_jaccard!r})")
        if not self.buckets or set(self.buckets) - set(BUCKETS):
            out.append(f"sft.rejection.buckets must be a non-empty subset of {list(BUCKETS)} "
                       f"(got {self.buckets!r})")
        if self.max_action_tokens and self.min_action_tokens > self.max_action_tokens:
            out.append("sft.rejection.min_action_tokens must be <= max_action_tokens")
        return out
