"""Recompute token logprobs with a plain forward pass (the learner's view of π)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from taurl.policy.logits import sequence_logprobs as logprobs_from_logits


def sequence_logprobs(model: torch.nn.Module, token_ids: Sequence[int],
                      temperature: float = 1.0) -> torch.Tensor:
    """log π(x_t | x_<t) for t = 1..n-1 of one sequence, shape (n,), entry 0 is 0.

    π = softmax(logits / temperature), the quantity the engine records as the behaviour
    logprob (temperature 0, greedy, is scored at 1, as the engine does). The math is
    `taurl.policy.logits.sequence_logprobs`; this only runs the model (its own forward,
    on its own device; the caller puts it in eval mode, as the engine does).
    """
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return logprobs_from_logits(logits, ids, temperature=temperature if temperature > 0 else 1.0)[0]
