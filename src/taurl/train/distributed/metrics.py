"""One update's metrics from every rank's part: what one rank would have reported (pure).

Each rank accumulates its micro-batches as the single learner does
(`taurl.train.learner.Learner._accumulate`): a mean metric as Σ_j w_j·v_j with
w_j = (action tokens of micro-batch j) / (action tokens of the whole batch), the loss as
Σ_j loss_j (each already divided by the global denominator), a maximum as the maximum.
Over ranks the partial sums add up and the maxima take the maximum, so the combination is
the single learner's value up to the order of the float additions.
"""

from __future__ import annotations

from collections.abc import Sequence

from taurl.train.mismatch import Mismatch, combine_mismatch

MAX_SUFFIXES = ("_max", "_max_raw")  # the learner's maxima (its _MAX_KEYS): combined by max


def combine_sums(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """The ranks' accumulated metrics as one: sums add, maxima take the maximum. A key a rank
    lacks (it held no micro-batch) is left out of that rank's part."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            if k in out and k.endswith(MAX_SUFFIXES):
                out[k] = max(out[k], v)
            else:
                out[k] = out.get(k, 0.0) + v
    return out


def combine_drift(parts: Sequence[Sequence[Mismatch]]) -> dict[str, float]:
    """mismatch/* over every rank's micro-batches (`taurl.train.mismatch.combine_mismatch`)."""
    return combine_mismatch([m for part in parts for m in part]).as_stats()
