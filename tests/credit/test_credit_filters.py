"""Batch filters: kept indices and counts, by hand and against loops."""

from __future__ import annotations

import numpy as np
import pytest

from taurl.credit import (
    TurnBatch,
    overlong_filter,
    preference_pairs,
    rejection_sampling,
    top_std_groups,
    zero_variance_filter,
)
from taurl.errors import ConfigError

# groups: "a" = [1, 1] (no signal), "b" = [1, 0, 0] (std 0.4714), "c" = [0] (alone),
# "d" = [1, 0] (std 0.5)
SCORES = np.array([1, 1, 1, 0, 0, 0, 1, 0], dtype=float)
GROUPS = np.array(["a", "a", "b", "b", "b", "c", "d", "d"])


def test_zero_variance_filter_drops_all_equal_groups():
    sel = zero_variance_filter(SCORES, GROUPS)
    np.testing.assert_array_equal(sel.kept, [2, 3, 4, 6, 7])
    assert sel.stats["learn/filter_zero_var_groups_dropped"] == 2  # "a" and "c"
    assert sel.stats["learn/filter_zero_var_rows_dropped"] == 3


def test_top_std_keeps_the_most_uncertain_groups():
    # std: a 0, b 0.4714, c 0, d 0.5; keep ceil(0.5·4) = 2 groups -> d, b
    sel = top_std_groups(SCORES, GROUPS, keep_fraction=0.5)
    np.testing.assert_array_equal(sel.kept, [2, 3, 4, 6, 7])
    # keep ceil(0.75·4) = 3: the tie between a and c (std 0) keeps the lower index, a
    sel = top_std_groups(SCORES, GROUPS, keep_fraction=0.75)
    np.testing.assert_array_equal(sel.kept, [0, 1, 2, 3, 4, 6, 7])
    assert sel.stats["learn/filter_top_std_groups_dropped"] == 1
    with pytest.raises(ConfigError):
        top_std_groups(SCORES, GROUPS, keep_fraction=0)


def test_overlong_filter():
    sel = overlong_filter(
        np.array([False, True, False, False]), lengths=np.array([10, 5, 99, 50]), max_length=64
    )
    np.testing.assert_array_equal(sel.kept, [0, 3])
    assert (
        sel.stats["learn/filter_truncated_dropped"] == 1
        and sel.stats["learn/filter_overlong_dropped"] == 1
    )
    with pytest.raises(ConfigError, match="lengths"):
        overlong_filter(np.array([False]), max_length=3)


def test_rejection_sampling_threshold_and_per_group_cap():
    scores = np.array([0.9, 0.5, 1.0, 0.95, 0.2, 1.0])
    group = np.array([0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(
        rejection_sampling(scores, group, threshold=0.9).kept, [0, 2, 3, 5]
    )
    # best two of group 0 that pass: 1.0 (row 2) and 0.95 (row 3)
    np.testing.assert_array_equal(
        rejection_sampling(scores, group, threshold=0.9, per_group=2).kept, [2, 3, 5]
    )


def test_rejection_sampling_matches_loop():
    rng = np.random.default_rng(0)
    scores, group = rng.integers(0, 5, 60) / 4, rng.integers(0, 6, 60)
    got = rejection_sampling(scores, group, threshold=0.5, per_group=3).kept
    want = []
    for g in range(6):
        rows = sorted((i for i in range(60) if group[i] == g), key=lambda i: (-scores[i], i))
        want += [i for i in rows[:3] if scores[i] >= 0.5]
    np.testing.assert_array_equal(got, sorted(want))


def test_preference_pairs():
    chosen, rejected, stats = preference_pairs(SCORES, GROUPS)
    # b: best row 2 (1.0) vs worst row 3 (first 0); d: 6 vs 7; a and c have no spread
    np.testing.assert_array_equal(chosen, [2, 6])
    np.testing.assert_array_equal(rejected, [3, 7])
    chosen, rejected, stats = preference_pairs(SCORES, GROUPS, mode="all")
    assert (
        list(zip(chosen, rejected, strict=True)) == [(2, 3), (2, 4), (6, 7)]
        and stats["learn/dpo_pairs"] == 3
    )


def test_filters_compose_with_batch_select():
    b = TurnBatch.build(SCORES, GROUPS, num_turns=[1, 2, 1, 2, 1, 1, 2, 1])
    kept = b.select(zero_variance_filter(b.scores, b.group).kept)
    assert kept.num_trajectories == 5 and kept.num_groups == 2
    assert kept.group_names == ("b", "d")
    np.testing.assert_array_equal(kept.group, [0, 0, 0, 1, 1])
