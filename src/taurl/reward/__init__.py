"""Verifiers and the reward stack."""

from taurl.reward.exact_match import VERIFIER_VERSION, exact_match, normalize_answer

__all__ = ["VERIFIER_VERSION", "exact_match", "normalize_answer"]
