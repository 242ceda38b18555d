"""Token logprobs and entropies from logits: `taurl.policy.logits` (their home, below the
learner: the policy's own recompute uses them too); re-exported here for the objectives."""

from taurl.policy.logits import sequence_entropy, sequence_logprobs

__all__ = ["sequence_entropy", "sequence_logprobs"]
