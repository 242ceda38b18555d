"""Recompute token logprobs with a plain forward pass (the learner's view of π)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def sequence_logprobs(model: torch.nn.Module, token_ids: Sequence[int], temperature: float = 1.0) -> torch.Tensor:
    """log π(x_t | x_<t) for t = 1..n-1 of one sequence, shape (n,), entry 0 is 0.

    π = softmax(logits / temperature), the same quantity the engine records as the
    behaviour logprob (temperature 0 is treated as 1, as the engine does).
    """
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    t = temperature if temperature > 0 else 1.0
    lp = torch.log_softmax(logits / t, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return torch.cat([lp.new_zeros(1), lp])
