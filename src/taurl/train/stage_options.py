"""The option records of the stages that replace RL's update: ``rl.dpo`` and ``rl.distill``.

They live apart from their learners (`taurl.train.pair_learner`, `taurl.train.distill`) so
that a config can hold them without importing torch: the ``rl`` section holds one instance
of each (`taurl.recipe.options.typed`), its file a mapping of the same keys. Each field's
comment is its documentation (docs/reference/config.md); the loader checks unknown keys and
types from the fields, ``problems()`` the ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

DISTILL_LOSSES = ("reverse_kl", "advantage")


@dataclass(frozen=True)
class DPOOptions:
    """``rl.dpo``: trajectory DPO's options (used when ``rl.objective: dpo``)."""

    beta: float = 0.1  # DPO β: the strength of the implicit KL to the reference
    label_smoothing: float = 0.0  # conservative DPO ε (0: the paper's loss)
    # best_worst (one pair per task) | all (every pair above min_margin)
    pairs: str = "best_worst"
    min_margin: float = 0.0  # a pair's rewards must differ by more than this
    # step-level pairs only: the two episodes share at least their first turn
    anchor: bool = False
    # offline: a trajectory JSONL file (export format) to pair; "" samples fresh pairs online
    data: str = ""
    pairs_per_update: int = 0  # offline: pairs per optimizer step (0: rl.tasks_per_update)

    def problems(self) -> list[str]:
        """The values out of range (keys and types are the loader's to check)."""
        out = []
        if not self.beta > 0:
            out.append(f"rl.dpo.beta must be > 0 (got {self.beta!r})")
        if not 0 <= self.label_smoothing < 0.5:
            out.append(f"rl.dpo.label_smoothing must be in [0, 0.5) (got {self.label_smoothing!r})")
        if self.pairs not in ("best_worst", "all"):
            out.append(f"rl.dpo.pairs must be best_worst or all (got {self.pairs!r})")
        if self.min_margin < 0 or self.pairs_per_update < 0:
            out.append("rl.dpo.min_margin and rl.dpo.pairs_per_update must be >= 0")
        return out


@dataclass(frozen=True)
class DistillOptions:
    """``rl.distill``: on-policy distillation's options (used when ``rl.teacher`` is set)."""

    # reverse_kl (exact, over the vocabulary) | advantage (−(log π_s − log π_t) on the sampled
    # token)
    loss: str = "reverse_kl"
    # weight of the env's reward (a PPO term on GRPO advantages); 0: pure distillation
    reward_weight: float = 0.0

    def problems(self) -> list[str]:
        """The values out of range (keys and types are the loader's to check)."""
        out = []
        if self.loss not in DISTILL_LOSSES:
            out.append(f"rl.distill.loss must be one of {list(DISTILL_LOSSES)} "
                       f"(got {self.loss!r})")
        if self.reward_weight < 0:
            out.append(f"rl.distill.reward_weight must be >= 0 (got {self.reward_weight!r})")
        return out
