"""Linear projections of the engine's decode step, with weights prepacked for oneDNN on the CPU.

A decode step multiplies a few dozen rows (one per sequence in the batch) by every weight of
the model, so on a CPU its time is the small-row fp32 GEMMs. torch runs ``F.linear`` on the CPU
through MKL; on this project's machine (AMD EPYC, AVX-512) a (32 × 576) · (576 × N) product
took 1.5-2.6× less CPU time through oneDNN with the weight reordered once into oneDNN's blocked
layout (``torch.ops.mkldnn._reorder_linear_weight``, as torch's own CPU inductor does for
frozen weights), the lm_head's (32 × 576) · (576 × 49,152) 58 → 22 ms. vLLM-CPU's linear layers
are oneDNN's too.

Both are fp32 GEMMs; they sum in another order, so a product differs by rounding (relative
~1e-6). Each packed weight is checked once when it is packed: its product with a fixed probe
must match ``F.linear``'s within `PACK_RTOL` of the result's scale, or the projection keeps the
plain weight (a kernel that reads the layout wrongly is off by O(1), not by rounding).
`Proj` falls back to ``F.linear`` wherever packing does not apply (not CPU, not fp32, a torch
without oneDNN).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

PACK_RTOL = 1e-5  # max |packed − F.linear| on the probe, relative to max |F.linear|
PACK_ROWS = 32  # the row count oneDNN's layout is chosen for (a decode batch)

log = logging.getLogger("taurl.engine")


def can_pack(weight: torch.Tensor) -> bool:
    """Whether `weight` can be served through a prepacked oneDNN GEMM here."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class Proj:
    """``proj(x) = x · Wᵀ + b`` for the linears `of` was given, side by side (one GEMM)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool):
        self.weight = weight
        self.bias = bias
        self.packed = packed

    @classmethod
    @torch.no_grad()
    def of(cls, linears: list[torch.nn.Linear], pack: bool = True) -> Proj:
        """One projection computing `linears` side by side; packed for oneDNN when `pack`
        and it passes the probe. A single unpacked linear keeps the module's own weight."""
        weight = linears[0].weight if len(linears) == 1 else torch.cat([m.weight for m in linears])
        bias = None
        if any(m.bias is not None for m in linears):
            bias = torch.cat([m.bias if m.bias is not None
                              else m.weight.new_zeros(m.weight.shape[0])
                              for m in linears])
        weight, bias = weight.detach(), None if bias is None else bias.detach()
        if not (pack and can_pack(weight)):
            return cls(weight, bias, packed=False)
        packed = cls(torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS), bias, packed=True)
        probe = torch.randn((8, weight.shape[1]), generator=torch.Generator().manual_seed(0))
        want = F.linear(probe, weight, bias)
        err = float((packed(probe) - want).abs().max())
        if err > PACK_RTOL * max(float(want.abs().max()), 1.0):
            log.warning("oneDNN's packed GEMM is off by %.3g on a %s weight; using F.linear",
                        err, tuple(weight.shape))
            return cls(weight, bias, packed=False)
        return packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
