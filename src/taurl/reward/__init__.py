"""Verifiers and the reward stack."""

from taurl.reward.exact_match import VERIFIER_VERSION, exact_match, normalize_answer

__all__ = ["VERIFIER_VERSION", "exact_match", "normalize_answer"]
from taurl.reward.stack import Judge, RewardBreakdown, RewardStack, Verdict, Verifier, Violation  # noqa: E402

__all__ += ["RewardBreakdown", "RewardStack", "Verdict", "Judge", "Verifier", "Violation"]
from taurl.reward.verifiers import ExactMatchVerifier  # noqa: E402

__all__ += ["ExactMatchVerifier"]
from taurl.reward.judge import OpenAICompatible, Rubric, RubricJudge  # noqa: E402

__all__ += ["OpenAICompatible", "Rubric", "RubricJudge"]
