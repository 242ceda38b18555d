"""Token logprobs and entropies from logits, aligned with the token stream.

Position t of the output belongs to token t (the logits at t−1 predict it); position 0 has
no predecessor and is 0. So the result lines up with `Trajectory.token_ids`,
`Trajectory.action_mask` and the behaviour logprobs, and a mask selects action tokens only.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sequence_logprobs(logits: Tensor, input_ids: Tensor, *, temperature: float = 1.0) -> Tensor:
    """log π(x_t | x_<t) for every position: (B, L, V) logits, (B, L) ids -> (B, L).

    Computed as logit − logsumexp (no full log-softmax tensor is kept). `temperature` must
    be the sampling temperature, since behaviour logprobs are log_softmax(logits / T).
    """
    z = logits[:, :-1].float() / temperature
    picked = z.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    logp = picked - torch.logsumexp(z, dim=-1)
    return torch.nn.functional.pad(logp, (1, 0), value=0.0)


def sequence_entropy(logits: Tensor, *, temperature: float = 1.0) -> Tensor:
    """H(π(· | x_<t)) for every position, aligned like `sequence_logprobs`: (B, L, V) -> (B, L)."""
    z = logits[:, :-1].float() / temperature
    logp = torch.log_softmax(z, dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return torch.nn.functional.pad(ent, (1, 0), value=0.0)
