"""The RL step's gradient norm: its sum of squares in fp64 (`taurl.train.optim.clip_global_norm`).

Why it matters: 1 rank and N ranks must report the same norm and clip by the same factor; an
fp32 sum of squares (torch's `clip_grad_norm_`) is off by ~1e-5 relative on a 135M model's
gradient, and FSDP2's shard-wise norms by as much again (benchmarks/dist_equivalence.py).
"""

from __future__ import annotations

import torch

from taurl.train.optim import clip_global_norm
from taurl.train.token_logprobs import gathered_logprobs


def _params(scale: float) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for n in (3_000_000, 1000, 7):  # one large tensor (fp32 sums lose digits there), small ones
        p = torch.nn.Parameter(torch.zeros(n))
        p.grad = scale * (1.0 + torch.rand(n, generator=gen)) ** 4
        out.append(p)
    return out


def test_the_norm_is_the_fp64_norm_and_the_clip_is_torchs():
    params = _params(1e-3)
    exact = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params))
    ref = [p.grad.clone() for p in params]
    norm = clip_global_norm(params, max_norm=1.0)
    assert norm.dtype == torch.float64
    assert abs(float(norm) - float(exact)) <= 1e-12 * float(exact)
    coef = 1.0 / (float(exact) + 1e-6)
    assert coef < 1.0  # the clip acted
    for p, g in zip(params, ref, strict=True):
        torch.testing.assert_close(p.grad, g * coef, rtol=1e-6, atol=0.0)
    theirs = [torch.nn.Parameter(torch.zeros_like(g)) for g in ref]
    for p, g in zip(theirs, ref, strict=True):
        p.grad = g.clone()
    torch_norm = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert abs(float(torch_norm) - float(norm)) <= 1e-4 * float(norm)  # the same norm, in fp32
    for p, q in zip(params, theirs, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=0.0)


def test_under_the_limit_nothing_changes_and_no_gradient_is_zero():
    params = _params(1e-6)
    ref = [p.grad.clone() for p in params]
    assert float(clip_global_norm(params, max_norm=1e6)) > 0
    assert all(torch.equal(p.grad, g) for p, g in zip(params, ref, strict=True))
    assert float(clip_global_norm([torch.nn.Parameter(torch.zeros(3))], 1.0)) == 0.0


def test_a_nan_norm_makes_every_gradient_nan_as_torch_does():
    # min(1, max_norm / nan) is 1.0 in Python: the finite gradients would be applied unclipped
    grads = [torch.tensor([float("nan"), 1.0]), torch.tensor([3.0, 4.0])]
    ours = [torch.nn.Parameter(torch.zeros(2)) for _ in grads]
    theirs = [torch.nn.Parameter(torch.zeros(2)) for _ in grads]
    for a, b, g in zip(ours, theirs, grads, strict=True):
        a.grad, b.grad = g.clone(), g.clone()
    assert torch.isnan(clip_global_norm(ours, 1.0))
    torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert all(torch.isnan(p.grad).all() for p in theirs)
    assert all(torch.isnan(p.grad).all() for p in ours)


def test_a_large_tensor_is_summed_in_chunks_to_the_same_norm(monkeypatch):
    from taurl.train import optim

    params = _params(1e-3)
    whole = float(clip_global_norm(params, max_norm=1e9))
    monkeypatch.setattr(optim, "_CHUNK", 4096)  # the 3M-element tensor in 733 chunks
    chunked = float(clip_global_norm(params, max_norm=1e9))
    assert abs(chunked - whole) <= 1e-12 * whole  # fp64 rounding of a 3M-term sum


def test_fp64_logits_give_fp64_logprobs_and_gradients():
    """A float64 model (the equivalence checks' --dtype float64) keeps fp64 through the
    learner's log-softmax: a cast to fp32 there would put fp32 rounding back in."""
    logits = torch.randn(5, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 3, 10, 2, 2])
    lp, _ = gathered_logprobs(logits, targets)
    assert lp.dtype == torch.float64
    exact = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.allclose(lp, exact, rtol=0, atol=1e-14)
    lp.sum().backward()
    assert logits.grad.dtype == torch.float64
