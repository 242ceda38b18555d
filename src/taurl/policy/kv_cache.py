"""A left-padded batch KV cache that rows can join and leave (for continuous batching).

Layout: every layer holds keys/values of shape (B, H, capacity, D); the first `width`
columns are in use and row i's real tokens fill the last ``lengths[i]`` of them (left
padding, masked out by `mask`). Decoding appends one column for all rows in place — no
copy of the cache per step, unlike the concatenating default cache — and the capacity
doubles when it runs out. Rows join by `merge` (the narrower side is left-padded) and
leave by `select`, which also drops columns that became padding for every row.
Rotary position is baked into the keys when they are written, so left padding never
shifts a row's positions (positions are passed explicitly); learned absolute positions
(GPT-2) read the same explicit position ids. Any model whose attention layers write
through ``Cache.update(key, value, layer_idx)`` (every HF decoder in transformers 5:
Qwen2, Llama, GPT-2, GPT-NeoX, ...) uses this cache unchanged. Tensors live on the
device of the keys the model writes.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GrowLayer(DynamicLayer):
    """A cache layer with preallocated capacity; `update` writes in place."""

    def __init__(self) -> None:
        super().__init__()
        self.width = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        if not self.is_initialized:
            self.device = key_states.device
            self.is_initialized = True
            self.keys = key_states.new_zeros((*key_states.shape[:2], max(2 * n, 16), key_states.shape[-1]))
            self.values = value_states.new_zeros((*value_states.shape[:2], self.keys.shape[2], value_states.shape[-1]))
        if self.width + n > self.keys.shape[2]:
            self._grow(max(2 * self.keys.shape[2], self.width + n))
        self.keys[:, :, self.width:self.width + n] = key_states
        self.values[:, :, self.width:self.width + n] = value_states
        self.width += n
        return self.keys[:, :, :self.width], self.values[:, :, :self.width]

    def _grow(self, capacity: int) -> None:
        k = self.keys.new_zeros((*self.keys.shape[:2], capacity, self.keys.shape[-1]))
        v = self.values.new_zeros((*self.values.shape[:2], capacity, self.values.shape[-1]))
        k[:, :, :self.width] = self.keys[:, :, :self.width]
        v[:, :, :self.width] = self.values[:, :, :self.width]
        self.keys, self.values = k, v

    def get_seq_length(self) -> int:
        return self.width

    def used(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[:, :, :self.width], self.values[:, :, :self.width]

    @classmethod
    def from_tensors(cls, keys: torch.Tensor, values: torch.Tensor) -> GrowLayer:
        layer = cls()
        layer.update(keys, values)
        return layer


class BatchKV:
    """The cache of a batch plus its attention mask (B, width) and real lengths."""

    def __init__(self, cache: Cache, mask: torch.Tensor, lengths: list[int]):
        self.cache = cache
        self.mask = mask
        self.lengths = lengths

    @classmethod
    def empty(cls, mask: torch.Tensor, lengths: list[int]) -> BatchKV:
        return cls(Cache(layer_class_to_replicate=GrowLayer), mask, list(lengths))

    def zero_padding(self) -> None:
        """Zero the keys/values at padded positions.

        Padded query rows attend to nothing, which can leave NaN in deeper layers' states;
        masked-out NaN still poisons attention (0 * NaN), so padding must hold zeros.
        """
        pad = (self.mask == 0)[:, None, :, None]  # (B, 1, width, 1)
        for layer in self.cache.layers:
            k, v = layer.used()
            k.masked_fill_(pad, 0.0)
            v.masked_fill_(pad, 0.0)

    def extend_mask(self) -> torch.Tensor:
        """The mask for the next decode step: one more real column for every row."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        return self.mask

    def advance(self) -> None:
        self.lengths = [n + 1 for n in self.lengths]

    def merge(self, other: BatchKV) -> BatchKV:
        """Rows of self, then rows of other, left-padded to the wider of the two."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        layers = []
        for a, b in zip(self.cache.layers, other.cache.layers, strict=True):
            (ka, va), (kb, vb) = a.used(), b.used()
            k = torch.cat([_left_pad(ka, width, dim=2), _left_pad(kb, width, dim=2)], dim=0)
            v = torch.cat([_left_pad(va, width, dim=2), _left_pad(vb, width, dim=2)], dim=0)
            layers.append(GrowLayer.from_tensors(k, v))
        mask = torch.cat([_left_pad(self.mask, width, dim=1), _left_pad(other.mask, width, dim=1)], dim=0)
        return BatchKV(Cache(layers=layers), mask, self.lengths + other.lengths)

    def row(self, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row i's real keys/values per layer, (1, H, n, D) copies, padding and holes removed."""
        cols = self.mask[i].nonzero().squeeze(-1)
        out = []
        for layer in self.cache.layers:
            k, v = layer.used()
            out.append((k[i:i + 1, :, cols].clone(), v[i:i + 1, :, cols].clone()))
        return out

    @classmethod
    def from_prefixes(cls, prefixes: list[list[tuple[torch.Tensor, torch.Tensor]] | None]) -> BatchKV | None:
        """A batch cache holding each row's cached prefix, left-padded (None: no prefix)."""
        widths = [0 if p is None else p[0][0].shape[2] for p in prefixes]
        width = max(widths)
        if width == 0:
            return None
        template = next(p for p in prefixes if p is not None)
        layers = []
        for li in range(len(template)):
            ks, vs = [], []
            for p in prefixes:
                k, v = p[li] if p is not None else (template[li][0][:, :, :0], template[li][1][:, :, :0])
                ks.append(_left_pad(k, width, dim=2))
                vs.append(_left_pad(v, width, dim=2))
            layers.append(GrowLayer.from_tensors(torch.cat(ks), torch.cat(vs)))
        mask = torch.zeros((len(prefixes), width), dtype=torch.long, device=template[0][0].device)
        for i, w in enumerate(widths):
            mask[i, width - w:] = 1
        return cls(Cache(layers=layers), mask, widths)

    def clone(self) -> BatchKV:
        """An independent copy (keys, values, mask, lengths) that writes do not share."""
        layers = [GrowLayer.from_tensors(*(t.clone() for t in layer.used())) for layer in self.cache.layers]
        return BatchKV(Cache(layers=layers), self.mask.clone(), list(self.lengths))

    def select(self, rows: list[int]) -> BatchKV:
        """Keep `rows`, dropping leading columns that are padding for all of them."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        lengths = [self.lengths[i] for i in rows]
        # rows may have holes (a reused prefix, padding, then the new tokens): trim by the mask
        start = int(self.mask[idx].any(0).nonzero()[0])
        layers = []
        for layer in self.cache.layers:
            k, v = layer.used()
            layers.append(GrowLayer.from_tensors(k[idx, :, start:], v[idx, :, start:]))
        return BatchKV(Cache(layers=layers), self.mask[idx, start:], lengths)


def _left_pad(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)
