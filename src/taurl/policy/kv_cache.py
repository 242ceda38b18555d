"""A left-padded batch KV cache that rows can join and leave (for continuous batching).

Layout: every layer holds keys/values in buffers of shape (row capacity, H, column
capacity, D); the first `rows` rows and `width` columns are in use and row i's real tokens
fill the last ``lengths[i]`` of them (left padding, masked out by `mask`). Decoding
appends one column for all rows in place — no copy of the cache per step, unlike the
concatenating default cache — and a capacity doubles when it runs out.

Rows join by `merge` and leave by `remove`, both in place: a joining row is written into
the spare rows (left-padded to the batch's width), and a leaving row's place is taken by
one of the last rows, so a step where rows come and go copies those rows only, never the
whole batch (a copy of every row at every join and leave was a fifth of the engine's time
on the demo policy). Leading columns that became padding for every row are dropped once
they are an eighth of the width (one copy; until then attention reads them, masked).
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

TRIM_MIN_COLUMNS = 16  # never copy the batch to drop fewer leading padding columns than this


class GrowLayer(DynamicLayer):
    """A cache layer with spare rows and columns; `update` writes in place.

    ``keys``/``values`` are the whole buffers; `used` is the part in use. What lies outside
    it is never read (uninitialized memory), and padding inside it holds zeros.
    """

    def __init__(self) -> None:
        super().__init__()
        self.rows = 0
        self.width = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        b, n = key_states.shape[0], key_states.shape[-2]
        if not self.is_initialized:
            self.device = key_states.device
            self.is_initialized = True
            self.keys = key_states.new_empty((b, key_states.shape[1], max(2 * n, 16),
                                              key_states.shape[-1]))
            self.values = value_states.new_empty((b, value_states.shape[1], self.keys.shape[2],
                                                  value_states.shape[-1]))
            self.rows = b
        if b != self.rows:
            raise ValueError(f"{b} rows of keys for a cache of {self.rows} rows")
        if self.width + n > self.keys.shape[2]:
            self._resize(self.keys.shape[0], max(2 * self.keys.shape[2], self.width + n))
        self.keys[:b, :, self.width:self.width + n] = key_states
        self.values[:b, :, self.width:self.width + n] = value_states
        self.width += n
        return self.used()

    def _resize(self, row_cap: int, col_cap: int, drop: int = 0, pad: int = 0) -> None:
        """New buffers holding the used part without its first `drop` columns, after `pad`
        zero columns."""
        k, v = (x[:, :, drop:] for x in self.used())
        w = k.shape[2] + pad
        kb = k.new_empty((row_cap, k.shape[1], max(col_cap, w), k.shape[3]))
        vb = v.new_empty((row_cap, v.shape[1], kb.shape[2], v.shape[3]))
        for buf, x in ((kb, k), (vb, v)):
            buf[:self.rows, :, :pad] = 0
            buf[:self.rows, :, pad:w] = x
        self.keys, self.values, self.width = kb, vb, w

    def get_seq_length(self) -> int:
        return self.width

    def used(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[:self.rows, :, :self.width], self.values[:self.rows, :, :self.width]

    def move_rows(self, dst: list[int], src: list[int], rows: int) -> None:
        """Rows `src` take the places `dst`; the first `rows` rows are then in use."""
        if dst:
            d, s = (torch.tensor(x, device=self.keys.device) for x in (dst, src))
            for buf in (self.keys, self.values):
                buf[d, :, :self.width] = buf[s, :, :self.width]
        self.rows = rows

    def drop_columns(self, n: int) -> None:
        self._resize(self.keys.shape[0], self.keys.shape[2], drop=n)

    def pad_columns(self, n: int) -> None:
        self._resize(self.keys.shape[0], max(self.keys.shape[2], self.width + n + 16), pad=n)

    def append_rows(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Rows of `keys`/`values` (m, H, w, D), w <= width, left-padded with zeros."""
        m, w = keys.shape[0], keys.shape[2]
        if self.rows + m > self.keys.shape[0]:
            self._resize(max(2 * self.keys.shape[0], self.rows + m), self.keys.shape[2])
        for buf, x in ((self.keys, keys), (self.values, values)):
            buf[self.rows:self.rows + m, :, :self.width - w] = 0
            buf[self.rows:self.rows + m, :, self.width - w:self.width] = x
        self.rows += m

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
        """Rows of self, then rows of other (copied in), left-padded to the wider of the two.

        In place: returns self. Only when `other` is wider are self's rows copied (once, to
        make room on the left).
        """
        width, w = self.mask.shape[1], other.mask.shape[1]
        if w > width:
            for layer in self.cache.layers:
                layer.pad_columns(w - width)
            self.mask = _left_pad(self.mask, w, dim=1)
        for a, b in zip(self.cache.layers, other.cache.layers, strict=True):
            a.append_rows(*b.used())
        self.mask = torch.cat([self.mask, _left_pad(other.mask, self.mask.shape[1], dim=1)], dim=0)
        self.lengths = self.lengths + other.lengths
        return self

    def remove(self, rows: list[int]) -> list[int]:
        """Drop `rows` in place; returns the kept rows' old indices in their new order.

        The last kept rows move into the places of removed ones (one row copy each), so the
        order changes: the caller reorders whatever it aligns with the rows by the result.
        """
        gone, n = set(rows), len(self.lengths)
        left = n - len(gone)
        holes = [i for i in sorted(gone) if i < left]
        movers = [i for i in range(left, n) if i not in gone]
        order = list(range(left))
        for h, m in zip(holes, movers, strict=True):
            order[h] = m
        for layer in self.cache.layers:
            layer.move_rows(holes, movers, left)
        idx = torch.tensor(order, dtype=torch.long, device=self.mask.device)
        self.mask = self.mask[idx]
        self.lengths = [self.lengths[i] for i in order]
        if left:
            self._trim()
        return order

    def _trim(self) -> None:
        """Drop leading columns that are padding for every row, once they are worth a copy."""
        lead = int(self.mask.any(0).nonzero()[0])
        if lead >= max(TRIM_MIN_COLUMNS, self.mask.shape[1] // 8):
            for layer in self.cache.layers:
                layer.drop_columns(lead)
            self.mask = self.mask[:, lead:]

    def row(self, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row i's real keys/values per layer, (1, H, n, D) copies, padding and holes removed."""
        cols = self.mask[i].nonzero().squeeze(-1)
        a, b = int(cols[0]), int(cols[-1]) + 1
        contiguous = b - a == cols.numel()  # no hole: a slice copy instead of a gather
        out = []
        for layer in self.cache.layers:
            k, v = layer.used()
            if contiguous:
                out.append((k[i:i + 1, :, a:b].clone(), v[i:i + 1, :, a:b].clone()))
            else:  # indexing with a tensor already copies
                out.append((k[i:i + 1, :, cols], v[i:i + 1, :, cols]))
        return out

    @classmethod
    def from_prefixes(cls, prefixes: list[list[tuple[torch.Tensor, torch.Tensor]] | None]
                      ) -> BatchKV | None:
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
                k, v = p[li] if p is not None else (template[li][0][:, :, :0],
                                                    template[li][1][:, :, :0])
                ks.append(_left_pad(k, width, dim=2))
                vs.append(_left_pad(v, width, dim=2))
            layers.append(GrowLayer.from_tensors(torch.cat(ks), torch.cat(vs)))
        mask = torch.zeros((len(prefixes), width), dtype=torch.long, device=template[0][0].device)
        for i, w in enumerate(widths):
            mask[i, width - w:] = 1
        return cls(Cache(layers=layers), mask, widths)

    def clone(self) -> BatchKV:
        """An independent copy (keys, values, mask, lengths) that writes do not share."""
        layers = [GrowLayer.from_tensors(*(t.clone() for t in layer.used()))
                  for layer in self.cache.layers]
        return BatchKV(Cache(layers=layers), self.mask.clone(), list(self.lengths))

    def select(self, rows: list[int]) -> BatchKV:
        """A new cache of `rows` (repeats allowed), dropping leading columns that are padding
        for all of them."""
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
