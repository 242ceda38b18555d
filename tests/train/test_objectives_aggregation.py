"""Aggregation modes: hand-computed numbers, per-trajectory pooling, loops on random inputs."""

from __future__ import annotations

import pytest
import torch

from taurl.errors import ConfigError
from taurl.train.objectives import AGGREGATIONS, aggregate

V = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_modes_by_hand():
    # masked tokens: row 0 -> 1, 2 (sum 3, 2 tokens); row 1 -> 4 (sum 4, 1 token)
    assert aggregate(V, M, "token-mean").item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert aggregate(V, M, "seq-mean-token-mean").item() == pytest.approx(2.75)  # (1.5 + 4) / 2
    assert aggregate(V, M, "seq-mean-token-sum").item() == pytest.approx(3.5)  # (3 + 4) / 2
    # 7 / (2 · L=3)
    assert aggregate(V, M, "seq-mean-token-sum-norm").item() == pytest.approx(7 / 6)
    assert aggregate(V, M, "seq-mean-token-sum-norm", norm_constant=10).item() == pytest.approx(
        0.35
    )


def test_one_trajectory_over_several_rows_is_normalized_once():
    # both rows belong to trajectory 0: one sequence with tokens 1, 2, 4
    idx = torch.tensor([0, 0])
    assert aggregate(V, M, "seq-mean-token-mean", traj_index=idx).item() == pytest.approx(7 / 3)
    assert aggregate(V, M, "seq-mean-token-sum", traj_index=idx).item() == pytest.approx(7)
    assert aggregate(V, M, "token-mean", traj_index=idx).item() == pytest.approx(7 / 3)


def test_denominator_override_for_micro_batches():
    # two micro-batches with a global token count sum to the full-batch token mean
    full = aggregate(V, M, "token-mean")
    parts = aggregate(V[:1], M[:1], "token-mean", denominator=3) + aggregate(
        V[1:], M[1:], "token-mean", denominator=3
    )
    assert parts.item() == pytest.approx(full.item())


def test_empty_mask_and_garbage_off_mask():
    z = torch.zeros_like(M)
    for mode in AGGREGATIONS:
        assert aggregate(V, z, mode).item() == 0.0
    bad = V.clone()
    bad[0, 2] = float("nan")
    bad[1, 1] = float("inf")
    for mode in AGGREGATIONS:
        assert torch.isfinite(aggregate(bad, M, mode))


def test_unknown_mode_says_did_you_mean():
    with pytest.raises(ConfigError, match="Did you mean 'token-mean'"):
        aggregate(V, M, "token_mean")


@pytest.mark.parametrize("seed", range(3))
def test_modes_match_loops(seed):
    g = torch.Generator().manual_seed(seed)
    b, length = 7, 9
    v = torch.randn(b, length, generator=g)
    m = torch.rand(b, length, generator=g) < 0.5
    idx = torch.randint(0, 4, (b,), generator=g)
    seqs: dict[int, list[float]] = {}
    for i in range(b):
        seqs.setdefault(int(idx[i]), []).extend(float(v[i, t]) for t in range(length) if m[i, t])
    seqs = {k: x for k, x in seqs.items() if x}
    tokens = [x for xs in seqs.values() for x in xs]
    want = {
        "token-mean": sum(tokens) / len(tokens),
        "seq-mean-token-mean": sum(sum(x) / len(x) for x in seqs.values()) / len(seqs),
        "seq-mean-token-sum": sum(sum(x) for x in seqs.values()) / len(seqs),
        "seq-mean-token-sum-norm": sum(sum(x) for x in seqs.values()) / (len(seqs) * 20),
    }
    for mode, w in want.items():
        got = aggregate(v, m, mode, traj_index=idx, norm_constant=20)
        assert got.item() == pytest.approx(w, rel=1e-5, abs=1e-6), mode
