"""benchmarks/long_credit.py: the advantage probe's optimal-action labels and its scores,
on a hand-solved map."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from taurl import envs

BENCH = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))  # long_credit imports its sibling estimators.py
_spec = importlib.util.spec_from_file_location("bench_long_credit", BENCH / "long_credit.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

# S F F F      d(S) = 6: down-down-right-down-right-right or right-right-down-down-down-right
# F H F H
# F F F H
# H F F G
TASK = envs.Task(task_id="t", prompt="", answers=(), split="train", env="frozenlake-v0",
                 metadata={"map": ["SFFF", "FHFH", "FFFH", "HFFG"], "slippery": False})


def _traj(*moves: str) -> SimpleNamespace:
    return SimpleNamespace(
        turns=[SimpleNamespace(action_text=f"<action>{m}</action>") for m in moves]
    )


def test_optimal_labels_by_hand():
    # right: d 6 -> 5 (optimal); left: back to S, d 6 (not); jump: invalid (not);
    # down: d 6 -> 5 (optimal)
    assert bench.optimal_labels(_traj("right", "left", "jump", "down"), TASK, 4).tolist() == [
        1, 0, 0, 1,
    ]
    # right then down into the hole at (1, 1): not optimal, and nothing is labelled after it
    labels = bench.optimal_labels(_traj("right", "down", "right"), TASK, 3)
    assert labels[:2].tolist() == [1, 0] and math.isnan(labels[2])
    # up into the wall: the state stays, d unchanged: not optimal
    assert bench.optimal_labels(_traj("up"), TASK, 1).tolist() == [0]


def test_alignment_scores():
    perfect = bench.alignment(np.array([1.0, -1.0, 2.0, -0.5]), np.array([1.0, 0.0, 1.0, 0.0]))
    assert perfect["pos_subopt"] == 0.0 and perfect["neg_opt"] == 0.0 and perfect["corr"] > 0.9
    # outcome-level credit: a successful episode's detour gets the same +1 as its optimal moves
    broadcast = bench.alignment(
        np.array([1.0, 1.0, 1.0, -1.0, -1.0]), np.array([1.0, 0.0, 1.0, 1.0, np.nan])
    )
    assert (
        broadcast["turns"] == 4
        and broadcast["pos_subopt"] == 1.0
        and abs(broadcast["neg_opt"] - 1 / 3) < 1e-12
    )  # optimal turns: +1, +1, -1
    # no spread, no corr
    assert math.isnan(bench.alignment(np.zeros(3), np.array([1.0, 0.0, 1.0]))["corr"])


def test_seed_interval_and_pooled_interval():
    m, lo, hi = bench.seed_interval([0.2, 0.4, 0.3])
    assert m == 0.3 and lo < 0.3 < hi
    runs = [{"holdout": {"final": {"trials": 1, "task_successes": {"a": 1, "b": 0}}}},
            {"holdout": {"final": {"trials": 1, "task_successes": {"a": 1, "b": 1}}}}]
    p, lo, hi = bench.pooled_interval(runs, "holdout")
    assert p == 0.75 and 0 <= lo < 0.75 < hi <= 1


def test_collapse_update_finds_a_zero_tail_of_at_least_three_updates():
    assert bench.collapse_update([0.2, 0.5, 0.0, 0.0, 0.0]) == 3
    # never succeeded: collapsed from the start
    assert bench.collapse_update([0.0, 0.0, 0.0, 0.0]) == 1
    # two zeros: a hard pair of updates, not yet a collapse
    assert bench.collapse_update([0.2, 0.0, 0.0]) is None
    assert bench.collapse_update([0.2, 0.0, 0.0, 0.0, 0.1]) is None  # it came back
    assert bench.collapse_update([]) is None


def test_paired_halfwidth_is_the_t_interval_of_the_differences():
    assert bench.paired_halfwidth([0.1, 0.1, 0.1]) == 0.0
    assert math.isnan(bench.paired_halfwidth([0.2]))
    # two pairs: t(1) = 12.706, stdev of (0, 0.2) = 0.1414, sqrt(2): half-width 1.2706
    assert abs(bench.paired_halfwidth([0.0, 0.2]) - 12.706 * 0.2 / 2) < 1e-2


def test_anchor_stats_counts_contrast_only_where_actions_differ():
    from taurl.credit import TurnBatch

    # one episode group of 3: all start in state 1; rollouts 0 and 1 take the same action there
    # (same later state 2), rollout 2 another (state 3); only rollout 0 succeeds
    b = TurnBatch.build(
        [1.0, 0.0, 0.0], ["g", "g", "g"], num_turns=[2, 2, 1],
        step_rewards=[[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]], state_hash=[[1, 2], [1, 2], [1, 0]],
    )
    acts = np.array([[0, 1], [0, 2], [3, -1]])
    s = bench.anchor_stats(b, acts)
    assert s["anchor_shared"] == 1.0  # state 1: 3 visits; state 2: 2 visits
    assert s["anchor_contrast"] == 1.0  # state 1: actions {0, 3}; state 2: actions {1, 2}
    same = bench.anchor_stats(b, np.array([[0, 1], [0, 1], [0, -1]]))
    assert same["anchor_contrast"] == 0.0  # every visit of each state took one action
    # A^S: returns at state 1 are (0.95, 0, 0), all differ from their mean; at state 2 (1, 0)
    assert s["step_nonzero"] == 1.0
    lost = TurnBatch.build(
        [0.0, 0.0, 0.0], ["g", "g", "g"], num_turns=[2, 2, 1],
        step_rewards=[[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], state_hash=[[1, 2], [1, 2], [1, 0]],
    )
    assert bench.anchor_stats(lost, acts)["step_nonzero"] == 0.0  # one outcome: every A^S is 0
