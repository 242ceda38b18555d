"""Log-probabilities of chosen tokens from (K, V) logits, in fp32, a chunk of rows at a time.

``log_softmax(logits / T)[target]`` written plainly keeps, for the backward pass, an fp32
(K, V) log-softmax (and, for the entropy, its exponential and a product): at the 49,152-token
vocabulary of SmolLM2 and 2,048 action tokens, each is 400 MB. Here each chunk of
`LOGPROB_CHUNK_ROWS` rows is computed as ``z[target] − logsumexp(z)`` (z = logits / T in
fp32) by one autograd function that keeps only the logits and the (K,) logsumexp, and
recomputes each chunk's softmax in the backward pass (``∂/∂z = g · (onehot(target) − p)``): what
stays alive between forward and backward is the (K, V) logits the model returned and a few
(K,) vectors; the fp32 work exists for one chunk at a time. The entropy comes from the same
pass without a graph, unless its gradient is asked for (an entropy bonus: then per chunk
with activation checkpointing). Results equal the plain computation to float
rounding (tests/train/test_token_logprobs.py: 1e-6).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

# rows of fp32 logits at a time: 32 × 49,152 × 4 B = 6 MB, cache-sized (fastest measured)
LOGPROB_CHUNK_ROWS = 32


def gathered_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0, *,
                      entropy: bool = False,
                      entropy_grad: bool = False, chunk_rows: int = LOGPROB_CHUNK_ROWS
                      ) -> tuple[Tensor, Tensor | None]:
    """(log π(target_k), H(π_k)) for each row k of `logits` (K, V), π = softmax(logits / T).

    Both (K,) fp32. The entropy is None unless `entropy`; it carries a gradient only with
    `entropy_grad`. Any logits dtype: the arithmetic is fp32.
    """
    ent_box: list[Tensor] = []
    want_free_entropy = entropy and not (entropy_grad and logits.requires_grad)
    lp = _GatheredLogprobs.apply(logits, targets, float(temperature), chunk_rows,
                                 ent_box if want_free_entropy else None)
    if not entropy:
        return lp, None
    if want_free_entropy:
        return lp, ent_box[0]
    ents = [checkpoint(_entropy, logits[s:s + chunk_rows], temperature, use_reentrant=False)
            for s in range(0, logits.shape[0], chunk_rows)]
    return lp, torch.cat(ents) if ents else logits.new_zeros(0, dtype=torch.float32)


class _GatheredLogprobs(torch.autograd.Function):
    """z[y] − logsumexp(z), z = x / T in fp32, chunk by chunk; saves x (no copy) and the (K,)
    logsumexp, and recomputes softmax(z) per chunk in backward: ∂/∂z = g · (onehot(y) − p)."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, temperature: float, chunk: int,
                ent_box: list | None) -> Tensor:
        lses, picked, ents = [], [], []
        for s in range(0, x.shape[0], chunk):
            z = _scaled(x[s:s + chunk], temperature)
            lse = torch.logsumexp(z, dim=-1)
            lses.append(lse)
            picked.append(z.gather(-1, y[s:s + chunk].unsqueeze(-1)).squeeze(-1) - lse)
            if ent_box is not None:  # the entropy from the same chunk, no graph: −Σ p log p
                logp = z - lse.unsqueeze(-1)
                ents.append(-(logp.exp() * logp).sum(-1))
        empty = x.new_zeros(0, dtype=torch.float32)
        if ent_box is not None:
            ent_box.append(torch.cat(ents) if ents else empty)
        ctx.save_for_backward(x, y, torch.cat(lses) if lses else empty)
        ctx.temperature, ctx.chunk = temperature, chunk
        return torch.cat(picked) if picked else empty

    @staticmethod
    def backward(ctx, g: Tensor):
        x, y, lse = ctx.saved_tensors
        grad = torch.empty_like(x)
        for s in range(0, x.shape[0], ctx.chunk):
            z = _scaled(x[s:s + ctx.chunk], ctx.temperature)
            gz = torch.exp(z - lse[s : s + ctx.chunk].unsqueeze(-1)).mul_(
                -g[s : s + ctx.chunk].unsqueeze(-1)
            )
            gz.scatter_add_(
                -1, y[s : s + ctx.chunk].unsqueeze(-1), g[s : s + ctx.chunk].unsqueeze(-1)
            )
            grad[s : s + ctx.chunk] = gz / ctx.temperature if ctx.temperature != 1.0 else gz
        return grad, None, None, None, None


def _scaled(x: Tensor, temperature: float) -> Tensor:
    # at least fp32: fp64 logits (a float64 model, the equivalence checks) stay fp64
    z = x if x.dtype == torch.float64 else x.float()
    return z / temperature if temperature != 1.0 else z


def _entropy(x: Tensor, temperature: float) -> Tensor:
    # H = −Σ p log p on one chunk's log-softmax (logsumexp(z) − Σ p z would cancel digits)
    logp = torch.log_softmax(_scaled(x, temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)
