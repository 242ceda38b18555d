"""Estimators and the zero-advantage filter on trajectories the real agent loop recorded.

frozenlake-v0 episodes are played through `run_episode` by a scripted engine on one fixed
map: the outcome then arrives as the final step's reward (``turn.env_reward``,
``reward_components={"outcome": r}``), as on every real rollout — not as a reward no turn
carries, which is how hand-built test batches used to inject it.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from taurl import envs
from taurl.credit import TurnBatch, compute_advantages, segment_grpo
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.synth import ScriptedEngine
from taurl.train.critic import value_positions
from taurl.train.learner import Learner, LearnerConfig

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]
R, L, D, U = (
    "<action>right</action>", "<action>left</action>", "<action>down</action>",
    "<action>up</action>",
)
SHORTEST = [D, D, R, R, D, R]  # (0,0) → (2,0) → (2,2) → (3,2) → (3,3)
PATHS = {
    "goal": SHORTEST,
    "detour": [L, *SHORTEST],  # a wall bump first: same outcome, a longer path
    "hole": [R, D],  # (0,1) → (1,1) is a hole
    "wander": [L, U, L, U, L, U],  # wall bumps until max_turns: truncated
}


@pytest.fixture(scope="module")
def tokenizer():
    from taurl.envs.gym.frozenlake import frozenlake_expert
    from taurl.policy import build_tokenizer

    tasks = envs.make_tasks("frozenlake-v0", "train", 50)
    texts = [t.prompt for t in tasks] + [
        a for t in tasks for a in frozenlake_expert(t, random.Random(0))
    ]
    return build_tokenizer(texts + [envs.make("frozenlake-v0").system_prompt], vocab_size=400)


def _task(group: str) -> envs.Task:
    return envs.Task(task_id=group, prompt="", answers=(), split="train", env="frozenlake-v0",
                     metadata={"map": MAP, "slippery": False})


@pytest.fixture(scope="module")
def rollouts(tokenizer):
    out = {}
    for name, actions in PATHS.items():
        env = envs.make("frozenlake-v0", max_turns=6 if name == "wander" else 10)
        traj = asyncio.run(
            run_episode(
                ScriptedEngine(tokenizer, actions), env, tokenizer, _task("g"), seed=0,
                config=RolloutConfig(max_turns=10, max_action_tokens=16, max_episode_tokens=200),
                episode_id=name, group_id="g",
            )
        )
        out[name] = traj
    return out


def test_the_real_loop_delivers_the_outcome_as_the_last_step_reward(rollouts):
    """The premise of the batch's outcome handling, checked on the records themselves."""
    goal, hole, wander = rollouts["goal"], rollouts["hole"], rollouts["wander"]
    assert goal.terminated and goal.reward == 1.0 and goal.turns[-1].env_reward == 1.0
    assert goal.reward_components == {"outcome": 1.0}
    assert hole.terminated and hole.reward == 0.0 and wander.truncated and len(wander.turns) == 6
    b = TurnBatch.from_trajectories([goal, hole])
    np.testing.assert_allclose(b.rewards, [1.0, 0.0])  # the outcome, apart from the step rewards
    np.testing.assert_allclose(b.step_rewards, 0.0)
    np.testing.assert_allclose(b.scores, [1.0, 0.0])  # sums unchanged
    np.testing.assert_allclose(b.turn_rewards()[0, len(goal.turns) - 1], 1.0)


def test_segment_grpo_all_credits_every_segment_with_the_recorded_outcome(rollouts):
    """Two sub-goal segments each (the first ends at turn 0); outcomes goal 1, hole 0.

    outcome="all": S_{i,k} = (rewards inside segment k) + outcome_i, so both segment
    positions compare 1 vs 0 → advantages (1 − ½)/(½ + eps) = ±1 on every turn. Before the
    fix the first segments of real rollouts scored 0 and 0 (the outcome sat in the last
    step reward, which only the last segment sums), so they got no credit at all.
    """
    trajs = [
        dataclasses.replace(rollouts[n], metadata={"subgoal_end": [0]}) for n in ("goal", "hole")
    ]
    b = TurnBatch.from_trajectories(trajs)
    assert b.segment_id[0, :2].tolist() == [0, 1] and b.segment_id[1, :2].tolist() == [0, 1]
    adv = segment_grpo(b, outcome="all").advantages
    np.testing.assert_allclose(adv[0, 0], 1.0, atol=1e-5)  # the goal run's first segment
    np.testing.assert_allclose(adv[1, 0], -1.0, atol=1e-5)
    np.testing.assert_allclose(adv[0, 1:len(trajs[0].turns)], 1.0, atol=1e-5)
    # outcome="last": only the last segment carries the outcome, the first ones tie at 0
    last = segment_grpo(b, outcome="last").advantages
    assert last[0, 0] == 0.0 and last[1, 0] == 0.0 and last[0, 1] > 0


def _model() -> Qwen2ForCausalLM:
    cfg = Qwen2Config(
        vocab_size=512, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, max_position_embeddings=512, pad_token_id=0,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()


def test_zero_variance_filter_keeps_a_gigpo_group_of_one_outcome_with_different_paths(rollouts):
    """goal and detour both reach the goal: equal scores, so GRPO has nothing to learn, but
    GiGPO's step part compares them at the shared start state (returns γ^5 vs γ^6), so the
    group carries signal and must be trained on (it was dropped by an outcome-only filter)."""
    group = [rollouts["goal"], rollouts["detour"]]
    gig = Learner(_model(), LearnerConfig(estimator="gigpo", estimator_options={"gamma": 0.9}))
    kept, adv, stats = gig.advantages(group)
    assert len(kept) == 2 and np.abs(adv).max() > 0.1
    assert (
        stats["learn/filter_zero_var_groups"] == 1.0
        and stats["learn/filter_zero_var_groups_kept"] == 1.0
    )
    assert stats["learn/filter_zero_adv_groups_dropped"] == 0.0
    # an outcome-only estimator on the same group: all advantages 0 → dropped, and counted
    kept, _, stats = Learner(_model(), LearnerConfig(estimator="grpo")).advantages(group)
    assert kept == [] and stats["learn/filter_zero_adv_groups_dropped"] == 1.0


def test_gae_bootstraps_the_truncated_rollout_from_the_critic_and_not_the_terminated_one(rollouts):
    """The learner's critic gives V(s_t) at the token before each action and V(s_T) at the end;
    GAE uses V(s_T) for the truncated `wander` episode only."""
    trajs = [rollouts["hole"], rollouts["wander"]]
    learner = Learner(
        _model(), LearnerConfig(estimator="gae", estimator_options={"gamma": 1.0, "lam": 1.0})
    )
    torch.nn.init.constant_(learner.critic.model.head.bias, 0.5)  # V ≡ 0.5 + w·h; w = 0 → V ≡ 0.5
    a = learner.assign(trajs)
    np.testing.assert_allclose(a.batch.values[a.batch.turn_mask], 0.5, atol=1e-6)
    np.testing.assert_allclose(a.batch.bootstrap_values, 0.5, atol=1e-6)
    # λ = γ = 1: A_t = Σ r + V_after − V(s_t); hole terminated: 0 + 0 − 0.5; wander
    # truncated: 0 + 0.5 − 0.5
    np.testing.assert_allclose(a.credit.advantages[0, :2], -0.5, atol=1e-6)
    np.testing.assert_allclose(a.credit.advantages[1, :6], 0.0, atol=1e-6)
    pos, last = value_positions(trajs[1])
    starts = [
        sum(len(s.token_ids) for s in trajs[1].segments[: t.action_segment]) for t in trajs[1].turns
    ]
    assert pos.tolist() == [s - 1 for s in starts] and last == trajs[1].num_tokens - 1
    assert all(trajs[1].action_mask[p] == 0 and trajs[1].action_mask[p + 1] == 1 for p in pos)


def test_compute_advantages_on_real_rollouts_is_unchanged_by_moving_the_outcome(rollouts):
    """GRPO reads scores, which moving the outcome off the last turn leaves as they were."""
    trajs = list(rollouts.values())
    b = TurnBatch.from_trajectories(trajs)
    np.testing.assert_allclose(b.scores, [t.reward for t in trajs])
    grpo = compute_advantages(b, "grpo").advantages
    assert grpo[0, 0] > 0 and grpo[2, 0] < 0
    assert copy.deepcopy(b.rewards).tolist() == [1.0, 1.0, 0.0, 0.0]
