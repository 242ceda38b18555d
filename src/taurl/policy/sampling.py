"""Draw the next token of every row: temperature, top-k, top-p, and a per-request generator."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def sample_tokens(logprobs: torch.Tensor, top_p: Sequence[float],
                  generators: Sequence[torch.Generator],
                  top_k: Sequence[int] | None = None) -> torch.Tensor:
    """Draw one id per row from softmax(logprobs) restricted to its top-k ids and top-p nucleus.

    logprobs: (B, V) normalized log-probabilities. Each row draws its uniform number from
    its own generator, so a seeded request samples the same ids whatever batch it is in
    (inverse-CDF sampling: the first id whose cumulative mass exceeds u). top_k: per row, the
    number of most likely ids kept (0: all); ids tied with the k-th are kept too.
    """
    if top_k is not None and any(k > 0 for k in top_k):
        logprobs = _keep_top_k(logprobs, top_k)
    probs = logprobs.exp()
    # CPU generators (device-independent draws), moved to where the probabilities are
    u = (
        torch.cat([torch.rand(1, generator=g) for g in generators])
        .unsqueeze(-1)
        .to(probs.device, probs.dtype)
    )
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


def _keep_top_k(logprobs: torch.Tensor, top_k: Sequence[int]) -> torch.Tensor:
    """`logprobs` with every id below its row's k-th largest set to -inf (rows with k = 0
    or k >= V unchanged); the draw renormalizes over what is left."""
    vocab = logprobs.shape[-1]
    ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_k], device=logprobs.device)
    kth = logprobs.sort(dim=-1, descending=True).values.gather(-1, (ks - 1).unsqueeze(-1))
    return torch.where(logprobs >= kth, logprobs, torch.full_like(logprobs, float("-inf")))
