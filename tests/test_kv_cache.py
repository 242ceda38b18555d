"""BatchKV: rows join and leave in place, and every row keeps exactly its own keys/values."""

from __future__ import annotations

import random

import torch
from transformers.cache_utils import Cache

from taurl.policy import kv_cache
from taurl.policy.kv_cache import BatchKV, GrowLayer

H, D, LAYERS = 2, 4, 2


def _fresh(tokens: list[torch.Tensor]) -> BatchKV:
    """A batch of new rows: row i's real keys are tokens[i] (n_i, H, D), left-padded."""
    width = max(t.shape[0] for t in tokens)
    kv = BatchKV.empty(
        torch.zeros(len(tokens), width, dtype=torch.long), [t.shape[0] for t in tokens]
    )
    keys = torch.zeros(len(tokens), H, width, D)
    for i, t in enumerate(tokens):
        keys[i, :, width - t.shape[0]:] = t.permute(1, 0, 2)
        kv.mask[i, width - t.shape[0]:] = 1
    for li in range(LAYERS):
        kv.cache.layers.append(GrowLayer())
        kv.cache.layers[li].update(keys * 2 ** li, -keys * 2 ** li)  # exact scalings
    return kv


def _real(kv: BatchKV, i: int, layer: int) -> torch.Tensor:
    k, v = kv.cache.layers[layer].used()
    assert torch.equal(v, -k)  # values travel with their keys
    cols = kv.mask[i].nonzero().squeeze(-1)
    pad = kv.mask[i] == 0
    assert torch.all(k[i][:, pad] == 0)  # padding holds zeros (NaN in it would poison attention)
    return k[i][:, cols].permute(1, 0, 2) / 2 ** layer


def test_rows_keep_their_own_keys_through_joins_leaves_and_decode_steps():
    rng = random.Random(0)
    torch.manual_seed(0)
    seqs: list[torch.Tensor] = [torch.randn(rng.randint(1, 30), H, D) for _ in range(5)]
    kv = _fresh(seqs)
    copied = trimmed = 0
    for step in range(300):
        op = rng.random()
        if op < 0.2 and len(seqs) > 1:  # some rows finish
            done = rng.sample(range(len(seqs)), rng.randint(1, len(seqs) - 1))
            order = kv.remove(done)
            assert sorted(order) == sorted(set(range(len(seqs))) - set(done))
            seqs = [seqs[i] for i in order]
        elif op < 0.4:  # new rows join, some longer than the batch is wide
            new = [
                torch.randn(rng.randint(1, 60 if rng.random() < 0.2 else 20), H, D)
                for _ in range(rng.randint(1, 4))
            ]
            before = kv.mask.shape[1]
            assert kv.merge(_fresh(new)) is kv
            copied += kv.mask.shape[1] > before
            seqs += new
        else:  # a decode step: one new column for every row
            tok = torch.randn(len(seqs), H, 1, D)
            kv.extend_mask()
            for li, layer in enumerate(kv.cache.layers):
                layer.update(tok * 2 ** li, -tok * 2 ** li)
            kv.advance()
            seqs = [torch.cat([s, tok[i].permute(1, 0, 2)]) for i, s in enumerate(seqs)]
        width = kv.mask.shape[1]
        trimmed += width < max(s.shape[0] for s in seqs) + kv_cache.TRIM_MIN_COLUMNS
        assert kv.lengths == [s.shape[0] for s in seqs]
        for i, s in enumerate(seqs):
            for li in range(LAYERS):
                assert torch.equal(_real(kv, i, li), s), (step, i, li)
            row = kv.row(i)
            assert torch.equal(row[1][0][0].permute(1, 0, 2) / 2, s)
        # leading all-padding columns never pile up past the trim rule
        lead = int(kv.mask.any(0).nonzero()[0])
        assert lead < max(kv_cache.TRIM_MIN_COLUMNS, width // 8)
    assert copied and trimmed  # both the widening join and the trim were exercised


def test_select_keeps_rows_in_the_order_asked_and_repeats_them():
    torch.manual_seed(1)
    seqs = [torch.randn(n, H, D) for n in (3, 7, 5)]
    kv = _fresh(seqs)
    out = kv.select([2, 2, 0])
    assert out.lengths == [5, 5, 3]
    for i, j in enumerate([2, 2, 0]):
        assert torch.equal(_real(out, i, 0), seqs[j])
    assert kv.lengths == [3, 7, 5]  # select copies: the source is unchanged


def test_an_empty_cache_grows_through_the_model_path():
    kv = BatchKV.empty(torch.ones(2, 3, dtype=torch.long), [3, 3])
    assert isinstance(kv.cache, Cache)
    k = torch.randn(2, H, 3, D)
    keys, values = kv.cache.update(k, -k, 0)
    assert torch.equal(keys, k) and kv.cache.get_seq_length() == 3
