"""Draw the next token of every row: temperature, top-p, and a per-request generator."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def sample_tokens(logprobs: torch.Tensor, top_p: Sequence[float],
                  generators: Sequence[torch.Generator]) -> torch.Tensor:
    """Draw one id per row from softmax(logprobs) restricted to its top-p nucleus.

    logprobs: (B, V) normalized log-probabilities. Each row draws its uniform number from
    its own generator, so a seeded request samples the same ids whatever batch it is in
    (inverse-CDF sampling: the first id whose cumulative mass exceeds u).
    """
    probs = logprobs.exp()
    # CPU generators (device-independent draws), moved to where the probabilities are
    u = torch.cat([torch.rand(1, generator=g) for g in generators]).unsqueeze(-1).to(probs.device, probs.dtype)
    if all(p >= 1.0 for p in top_p):  # no nucleus: skip the sort (the common case)
        cum = probs.cumsum(-1)
        return torch.searchsorted(cum, u * cum[:, -1:]).clamp(max=probs.shape[-1] - 1).squeeze(-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(-1)
    p = torch.tensor(top_p, dtype=probs.dtype, device=probs.device).unsqueeze(-1)
    # keep the smallest prefix whose mass reaches top_p (always at least one id)
    sorted_p = torch.where(cum - sorted_p < p, sorted_p, torch.zeros_like(sorted_p))
    cum = sorted_p.cumsum(-1)
    idx = torch.searchsorted(cum, u * cum[:, -1:]).clamp(max=probs.shape[-1] - 1)
    return order.gather(-1, idx).squeeze(-1)
