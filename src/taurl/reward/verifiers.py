"""Small outcome verifiers that plug into the reward stack (`taurl.reward.stack.Judge`)."""

from __future__ import annotations

from typing import Any

from taurl.reward.exact_match import VERIFIER_VERSION, exact_match
from taurl.reward.stack import Verdict


class ExactMatchVerifier:
    """Outcome 1 when the submitted answer exactly matches a gold alias (SQuAD normalization)."""

    version = VERIFIER_VERSION

    def verify(self, task: Any, submission: Any) -> Verdict:
        if not isinstance(submission, str):
            return Verdict(0.0, self.version, "no answer was submitted")
        score = exact_match(submission, task.answers)
        return Verdict(score, self.version,
                       "correct" if score else f"{submission[:80]!r} is not a gold answer")
