"""One decode step of a Llama-family decoder, without transformers' per-call machinery.

On a small policy a decode forward through ``model(...)`` is mostly Python: the output
dataclasses, keyword plumbing and decorators of every module, the causal-mask builder and
the rotary module run for each of the thousands of one-token steps a rollout takes
(docs/experiments/speed.md: "Rollout and learner overhead"). `SlimDecoder` runs the same modules'
weights through the same arithmetic for the decode case only (one new token per row, a
left-padded cache, explicit positions), per layer:

    h = x + o_proj(attention(rope(q_proj(n1(x))), rope(k_proj(n1(x))), v_proj(n1(x))))
    x = h + mlp(n2(h))                                       # n1, n2: the layers' RMSNorms
    logits = lm_head(norm(x))

with rope(t) = t·cos + rotate_half(t)·sin at each row's own position, from the model's own
``rotary_emb.inv_freq`` and ``attention_scaling`` (so scaled RoPE variants such as Llama 3's
are what the model computes), and attention = softmax(q·Kᵀ·scale + mask) · V over the
cache, grouped-query heads shared.

Exact, not merely close: each step runs the kernels transformers' forward runs, on the same
shapes, so on one machine its logits are the forward's bit for bit. That is why one row
(a matrix-vector product, whose rounding depends on the matrix's height) is projected by the
model's own q/k/v and gate/up layers, and grouped-query heads are packed as transformers' SDPA
path packs them for one query token (SDPA's ``enable_gqa`` sums in another order: on
SmolLM2-135M's 30 layers that rounding grew past `TOLERANCE`, and the check dropped the path).

It covers the architectures whose decoder layer is exactly that (Qwen2, Llama, Mistral:
`SUPPORTED`), with full attention in every layer, up to `MAX_PARAMS`; `for_model` returns
None for anything else, and the engine keeps the model's own forward. It is also verified, not
trusted: the engine's first decode step runs both and keeps the slim path only if the logprobs agree
(`agrees`), because a transformers release may change a layer's computation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from taurl.policy.packed_linear import Proj

SUPPORTED = frozenset({"qwen2", "llama", "mistral"})
TOLERANCE = 1e-4  # max |Δ log-softmax| between the slim step and the model's forward
MAX_PARAMS = 200_000_000  # larger policies are compute-bound: the slim path would gain little


class SlimDecoder:
    """``decoder(ids (B, 1), positions (B,), mask (B, W), cache) -> logits (B, V)``; writes
    the new keys/values through ``cache.layers[i].update`` as the model's forward would.

    Fewer ops per layer than the modules called one by one (on a small policy each op's
    dispatch, not its arithmetic, is the cost): q, k and v in one matmul, gate and up in
    one, RoPE applied to q and k together, RMSNorm as the one fused ``F.rms_norm``. The
    fused weights are copies, and on the CPU in fp32 every projection and the lm_head are
    served from oneDNN-prepacked copies (`taurl.policy.packed_linear`: 1.34x more tokens per
    CPU-second on SmolLM2-135M at 32 rows): `refresh()` rebuilds them after the model's
    weights change (the engine calls it on every weight load). They cost a second copy of
    the linear weights (~0.5 GB for a 135M fp32 policy), so the path is only offered to
    policies up to `MAX_PARAMS`.
    """

    def __init__(self, model: torch.nn.Module, packed: bool = True):
        inner = model.model
        # oneDNN-packed GEMMs for batches of 2+ rows (taurl.policy.packed_linear)
        self.pack = packed
        cfg = model.config
        self.layers = list(inner.layers)
        self.embed = inner.embed_tokens
        self.norm = inner.norm
        self.lm_head = model.get_output_embeddings()
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.rotary = inner.rotary_emb
        self.scale = float(self.layers[0].self_attn.scaling)
        self.projs: list[tuple[Proj, Proj, Proj, Proj]] = []  # per layer: qkv, o, gate|up, down
        self.refresh()

    @classmethod
    def for_model(cls, model: torch.nn.Module, packed: bool = True) -> SlimDecoder | None:
        """A slim decoder for `model`, or None when its architecture is not one it knows."""
        cfg = getattr(model, "config", None)
        if getattr(cfg, "model_type", None) not in SUPPORTED:
            return None
        if sum(p.numel() for p in model.parameters()) > MAX_PARAMS:
            return None  # compute-bound: little to gain, and the fused copies would cost memory
        inner = getattr(model, "model", None)
        if (inner is None or not hasattr(inner, "rotary_emb")
            or not hasattr(inner.rotary_emb, "inv_freq")):
            return None
        if any(t != "full_attention"
               for t in (getattr(cfg, "layer_types", None) or ["full_attention"])):
            return None  # sliding-window layers mask differently
        if cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None):
            return None
        needed = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")
        if not all(all(hasattr(layer, n) for n in needed) for layer in inner.layers):
            return None
        if not all(hasattr(layer.mlp, n) for layer in inner.layers
                   for n in ("gate_proj", "up_proj", "down_proj")):
            return None
        return cls(model, packed)

    @torch.no_grad()
    def refresh(self) -> None:
        """Rebuild the fused (and packed) weights from the model's current ones."""
        self.projs = []
        for layer in self.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.projs.append((Proj.of([a.q_proj, a.k_proj, a.v_proj], self.pack),
                               Proj.of([a.o_proj], self.pack),
                               # Llama's mlp_bias: biased
                               Proj.of([mlp.gate_proj, mlp.up_proj], self.pack),
                               Proj.of([mlp.down_proj], self.pack)))
        self.head = Proj.of([self.lm_head], self.pack)

    def release(self) -> None:
        """Drop the fused (and packed) copies, about one copy of the weights; the next call
        (or `refresh`, which a weight update runs anyway) builds them again."""
        self.projs = []
        self.head = None  # the output layer's packed copy too (vocab x hidden)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any,
                 exact: bool = False) -> torch.Tensor:
        """The step's logits. `exact`: through the model's own linear layers (bit for bit its
        forward: the engine's check), else through the fused, packed projections."""
        if not self.projs or self.head is None:  # released, and no weight update since
            self.refresh()
        b = ids.shape[0]
        # one row is a matrix-vector product, whose rounding depends on the matrix's height
        # (and oneDNN gains nothing there): the model's own layers, as its forward runs them
        own = exact or b == 1
        x = self.embed(ids)  # (B, 1, hidden)
        inv = self.rotary.inv_freq.to(x.device)
        # (B, D/2), fp32 as the model's rotary
        freqs = positions.to(inv.dtype)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        scaling = float(getattr(self.rotary, "attention_scaling", 1.0))
        cos = (emb.cos() * scaling).to(x.dtype)[:, None, None, :]  # (B, 1, 1, D)
        sin = (emb.sin() * scaling).to(x.dtype)[:, None, None, :]
        # additive mask: 0 where the row attends, the dtype's minimum on its padding
        bias = None
        if not bool(mask.all()):
            bias = torch.zeros(mask.shape, dtype=x.dtype, device=x.device)
            bias.masked_fill_(mask == 0, torch.finfo(x.dtype).min)
            bias = bias[:, None, None, :]
        d, h, kvh = self.head_dim, self.n_heads, self.n_kv
        for i, layer in enumerate(self.layers):
            qkv_p, o_p, gate_up_p, down_p = self.projs[i]
            a, mlp = layer.self_attn, layer.mlp
            n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
            hs = F.rms_norm(x, n1.weight.shape, n1.weight, n1.variance_epsilon)
            qkv = torch.cat([a.q_proj(hs), a.k_proj(hs), a.v_proj(hs)],
                            dim=-1) if own else qkv_p(hs)
            qkv = qkv.view(b, h + 2 * kvh, d)
            qk = qkv[:, :h + kvh, None, :]  # (B, h + kvh, 1, D): rotated together
            qk = qk * cos + _rotate_half(qk) * sin
            q = qk[:, :h]
            k = qk[:, h:]
            v = qkv[:, h + kvh:, None, :]
            keys, values = cache.layers[i].update(k, v)
            # grouped-query heads as transformers' SDPA path runs them for one query token
            # (`pack_gqa`): the kv_heads' query heads as a (B, kvh, h/kvh, D) query block.
            # `enable_gqa` computes the same attention in another order; over SmolLM2's 30
            # layers that rounding grew past `TOLERANCE` and the check dropped the slim path
            if bias is None:  # no padding: transformers drops the mask and runs SDPA's own GQA
                o = F.scaled_dot_product_attention(q, keys, values, scale=self.scale,
                                                   enable_gqa=kvh != h)
            else:
                o = F.scaled_dot_product_attention(q.reshape(b, kvh, h // kvh, d), keys, values,
                                                   attn_mask=bias, scale=self.scale)
            o = o.reshape(b, 1, h * d)
            x = x + (a.o_proj(o) if own else o_p(o))
            hs = F.rms_norm(x, n2.weight.shape, n2.weight, n2.variance_epsilon)
            gate, up = (mlp.gate_proj(hs),
                        mlp.up_proj(hs)) if own else gate_up_p(hs).chunk(2, dim=-1)
            act = mlp.act_fn(gate) * up
            x = x + (mlp.down_proj(act) if own else down_p(act))
        x = self.norm(x)
        return (self.lm_head(x) if own else self.head(x))[:, -1, :]


def _rotate_half(t: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    return torch.cat([-t[..., half:], t[..., :half]], dim=-1)


def agrees(slim_logits: torch.Tensor, model_logits: torch.Tensor,
           tolerance: float = TOLERANCE) -> float | None:
    """max |Δ log-softmax| when within `tolerance` (the slim path may serve), else None."""
    diff = float(
        (torch.log_softmax(slim_logits.float(), -1) - torch.log_softmax(model_logits.float(), -1))
        .abs()
        .max()
    )
    return diff if diff <= tolerance else None
