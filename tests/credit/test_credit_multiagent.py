"""Multi-agent credit: hand-computed numbers for RAE, zero-sum and proposer/solver groups."""

from __future__ import annotations

import numpy as np
import pytest

from taurl.credit import (
    TurnBatch,
    compute_advantages,
    grpo,
    learnability_reward,
    make_estimator,
    proposer_solver,
    rae,
    role_baselines,
    zero_sum,
)
from taurl.errors import ConfigError


def labelled(scores, groups, roles, matches=None, turns=None):
    b = TurnBatch.build(scores, groups, num_turns=turns)
    return b.replace(
        roles=tuple(roles),
        env_names=("ttt",) * len(roles),
        match_ids=tuple(matches) if matches else (),
    )


def test_role_baselines_hand_computed_update_then_subtract():
    # alpha = 0.5, keys x, o, x, x with returns 1, 0, 0, 1:
    # x: b = .5·0 + .5·1 = .5 -> A = .5;   o: b = 0 -> A = 0
    # x: b = .5·.5 + .5·0 = .25 -> A = -.25;   x: b = .5·.25 + .5·1 = .625 -> A = .375
    keys = [("ttt", "x"), ("ttt", "o"), ("ttt", "x"), ("ttt", "x")]
    given = {("ttt", "o"): 0.0}
    adv, new = role_baselines([1, 0, 0, 1], keys, given, alpha=0.5)
    np.testing.assert_allclose(adv, [0.5, 0.0, -0.25, 0.375])
    assert new == {("ttt", "x"): 0.625, ("ttt", "o"): 0.0}
    assert given == {("ttt", "o"): 0.0}  # pure: the caller's mapping is untouched


def test_rae_works_with_group_size_one_where_grpo_has_no_signal():
    # one match per task: every GRPO group is a singleton (advantage 0), RAE still learns
    b = labelled([1.0, 0.0], ["t1", "t2"], ["x", "x"], turns=[3, 2])
    assert np.all(grpo(b).advantages == 0)
    credit, base = rae(b, alpha=0.5)
    # b = .5 -> A = .5; b = .25 -> A = -.25; broadcast to the real turns only
    np.testing.assert_allclose(credit.advantages, [[0.5, 0.5, 0.5], [-0.25, -0.25, 0.0]])
    assert base == {("ttt", "x"): 0.25}
    assert credit.stats["learn/role_baseline/ttt/x"] == 0.25


def test_rae_estimator_keeps_its_baselines_across_updates():
    est = make_estimator("rae", alpha=0.5)
    est(labelled([1, 0, 0, 1], [0, 1, 2, 3], ["x", "o", "x", "x"]))
    # x's baseline is .625 from the first batch: b = .5·.625 + .5·1 = .8125 -> A = .1875
    c = est(labelled([1.0], [0], ["x"]))
    np.testing.assert_allclose(c.advantages[:, 0], [0.1875])
    # a fresh estimator starts at 0 again: b = .5 -> A = .5
    np.testing.assert_allclose(
        compute_advantages(labelled([1.0], [0], ["x"]), "rae", alpha=0.5).advantages[:, 0], [0.5]
    )


def test_rae_roles_do_not_share_a_baseline():
    # a game the first mover always wins: x returns 1, o returns 0 every time
    b = labelled([1, 0] * 50, range(100), ["x", "o"] * 50)
    credit, base = rae(b, alpha=0.9)
    assert base[("ttt", "x")] > 0.99 and base[("ttt", "o")] == 0.0
    # late in the run neither role is pushed: the baseline has learnt what the role gets
    assert np.all(np.abs(credit.advantages[-10:, 0]) < 0.01)


def test_rae_refuses_an_alpha_outside_0_1():
    with pytest.raises(ConfigError, match="alpha"):
        make_estimator("rae", alpha=1.5)
    with pytest.raises(ConfigError, match="Did you mean 'alpha'"):
        make_estimator("rae", alpah=0.9)


def test_zero_sum_hand_computed():
    # m1: win 1 / loss 0 -> ±0.5; m2: +1 / -1 -> ±1; m3: only one trained record -> 0
    b = labelled(
        [1, 0, 1, -1, 1],
        ["a", "a", "b", "b", "c"],
        ["x", "o", "x", "o", "x"],
        matches=["m1", "m1", "m2", "m2", "m3"],
    )
    c = zero_sum(b)
    np.testing.assert_allclose(c.advantages[:, 0], [0.5, -0.5, 1.0, -1.0, 0.0])
    # the players' advantages of a match sum to zero
    assert c.advantages[:4, 0].reshape(2, 2).sum(axis=1).tolist() == [0.0, 0.0]
    assert c.stats["learn/groups_singleton"] == 1


def test_zero_sum_without_match_ids_uses_the_group():
    c = zero_sum(TurnBatch.build([1, 0, 3, 1], ["g", "g", "h", "h"]))
    np.testing.assert_allclose(c.advantages[:, 0], [0.5, -0.5, 1.0, -1.0])


def test_proposer_solver_groups_by_group_and_role():
    # proposers of task t1: [.5, 0] -> mean .25, std .25 -> [+1, -1]
    # solvers of proposal p1: [1, 0, 0, 1] -> [+1, -1, -1, +1]
    roles = ["proposer", "proposer", "solver", "solver", "solver", "solver"]
    b = labelled([0.5, 0.0, 1, 0, 0, 1], ["t1", "t1", "p1", "p1", "p1", "p1"], roles)
    np.testing.assert_allclose(
        proposer_solver(b).advantages[:, 0], [1, -1, 1, -1, -1, 1], atol=1e-5
    )
    np.testing.assert_allclose(
        proposer_solver(b, scale="none").advantages[:, 0], [0.25, -0.25, 0.5, -0.5, -0.5, 0.5]
    )


def test_proposer_solver_never_compares_a_proposer_with_a_solver():
    # one group holding two proposers (1, 1) and two solvers (0, 0): GRPO pushes the
    # proposers up and the solvers down; per role there is nothing to learn
    b = labelled([1, 1, 0, 0], ["g"] * 4, ["proposer", "proposer", "solver", "solver"])
    np.testing.assert_allclose(grpo(b).advantages[:, 0], [1, 1, -1, -1], atol=1e-5)
    assert np.all(proposer_solver(b).advantages == 0)


def test_learnability_reward_hand_computed():
    np.testing.assert_allclose(learnability_reward([0.0, 0.25, 1.0, 0.5]), [0.0, 0.75, 0.0, 0.5])
    with pytest.raises(ConfigError):
        learnability_reward([1.5])
