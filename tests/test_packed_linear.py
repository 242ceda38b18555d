"""oneDNN-packed projections of the engine's decode step (taurl.policy.packed_linear)."""

from __future__ import annotations

import logging

import pytest
import torch

from taurl.policy import packed_linear
from taurl.policy.packed_linear import Proj, can_pack

pytestmark = pytest.mark.skipif(
    not can_pack(torch.zeros(1)), reason="this torch has no oneDNN on the CPU"
)


def _linears(*outs, inp=48, bias=True):
    torch.manual_seed(0)
    return [torch.nn.Linear(inp, n, bias=bias) for n in outs]


def test_fused_packed_projection_is_the_linears_side_by_side_within_rounding():
    lins = _linears(40, 8, 8)  # q, k, v of a grouped-query layer, biased (Qwen2)
    lins[1].bias = None  # a missing bias among present ones counts as zeros
    proj = Proj.of(lins)
    x = torch.randn(5, 1, 48)
    want = torch.cat([m(x) for m in lins], dim=-1)
    assert proj.packed
    torch.testing.assert_close(proj(x), want, rtol=1e-5, atol=1e-5)


def test_unpacked_projection_is_f_linear_bit_for_bit():
    lins = _linears(16, inp=24, bias=False)
    proj = Proj.of(lins, pack=False)
    x = torch.randn(3, 24)
    assert not proj.packed and proj.weight.data_ptr() == lins[0].weight.data_ptr()  # its own weight
    assert torch.equal(proj(x), lins[0](x))


def test_a_packed_gemm_that_fails_its_probe_falls_back_to_f_linear(monkeypatch, caplog):
    # a kernel that reads the packed layout wrongly is off by O(1): that weight stays unpacked
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(packed_linear.Proj, "__call__", lambda self, x: (
        real(x, self.weight, self.bias, "none", [], "") * 1.01 if self.packed
        else torch.nn.functional.linear(x, self.weight, self.bias)))
    with caplog.at_level(logging.WARNING, logger="taurl.engine"):
        proj = Proj.of(_linears(32))
    assert not proj.packed and "using F.linear" in caplog.text


def test_weights_that_cannot_be_packed_stay_plain():
    lins = _linears(16)
    lins[0].to(torch.float64)
    assert not can_pack(lins[0].weight) and not Proj.of(lins).packed
