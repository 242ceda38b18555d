"""Chunked, checkpointed token logprobs (taurl.train.token_logprobs) equal the plain log-softmax.

The plain reference is ``log_softmax(logits / T)`` over the whole (K, V) block, gathered; the
chunked path must give the same values, entropies and gradients within 1e-6 (fp32) whatever
the chunk size, and the learner's `action_logprobs` must give what a full forward gives.
"""

from __future__ import annotations

import pytest
import torch
from tests.train._tiny_lm import tiny_lm

from taurl.train.rows import Rows, action_logprobs
from taurl.train.token_logprobs import gathered_logprobs

# relative to max(1, |value|): fp32 carries 7 digits, so a logprob of -20 is known to ~2e-6
TOL = 1e-6


def _close(a, b, tol=TOL) -> bool:
    return bool(((a - b).abs() <= tol * b.abs().clamp(min=1.0)).all())


def _reference(logits, targets, temperature):
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_entropy_and_gradients_equal_the_plain_log_softmax(chunk, temperature):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(50, 3000, generator=g) * 4
    targets = torch.randint(0, 3000, (50,), generator=g)
    weights = torch.randn(50, generator=g)

    a = base.clone().requires_grad_(True)
    lp_ref, ent_ref = _reference(a, targets, temperature)
    ((lp_ref * weights).sum() + ent_ref.sum()).backward()

    b = base.clone().requires_grad_(True)
    lp, ent = gathered_logprobs(
        b, targets, temperature, entropy=True, entropy_grad=True, chunk_rows=chunk
    )
    ((lp * weights).sum() + ent.sum()).backward()

    assert lp.dtype == torch.float32 and lp.shape == (50,)
    assert _close(lp.detach(), lp_ref.detach())
    assert _close(ent.detach(), ent_ref.detach())
    assert _close(b.grad, a.grad)


def test_entropy_without_grad_carries_no_graph_and_bf16_logits_are_read_in_fp32():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(9, 500, generator=g) * 3).to(torch.bfloat16).requires_grad_(True)
    y = torch.randint(0, 500, (9,), generator=g)
    lp, ent = gathered_logprobs(x, y, 1.0, entropy=True, chunk_rows=4)
    assert lp.requires_grad and not ent.requires_grad
    ref, ent_ref = _reference(x.detach(), y, 1.0)
    assert _close(lp.detach(), ref)
    assert _close(ent, ent_ref)


def test_action_logprobs_equal_a_full_forward():
    """The learner's gathered logprobs at action positions are those of the full
    (B, L, V) forward."""
    model = tiny_lm(64)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, 64, (3, 20), generator=g)
    attention = torch.ones_like(ids)
    attention[2, 15:] = 0  # a right-padded row
    mask = torch.zeros(3, 20)
    mask[:, 8:14] = 1
    mask[1, 16:19] = 1
    rows = Rows(ids, attention, mask * attention, torch.zeros(3, 20), torch.zeros(3, 20))
    lp, ent = action_logprobs(model, rows, 0.8, with_entropy=True)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    ref, ent_ref = _reference(logits.reshape(-1, 64), ids[:, 1:].reshape(-1), 0.8)
    sel = rows.mask[:, 1:].bool().reshape(-1)
    assert _close(lp[:, 1:].reshape(-1)[sel].detach(), ref[sel])
    assert _close(ent[:, 1:].reshape(-1)[sel], ent_ref[sel])
    assert float(lp[:, 1:].reshape(-1)[~sel].abs().max()) == 0.0
