"""The learned step scorer's canary: padding or repetition never raises the shaped reward.

A real implicit PRM (a tiny Qwen2 φ, trained with trajectory DPO on a success vs a failure
of one task) scores real multi-turn records. φ learns to like the successful episode's
first action, so a policy that *repeats* that action — in a successful episode (padding)
or in a failed one (imitating the look of success) — would be paid more per liked step if
the step rewards were summed. The centring of `taurl.credit.prm.episode_neutral_shaping`
is what stops it; `python tests/mutation_check.py no-centering` switches it off and
requires every `attack` test here to fail (tests/mutation_check.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.train._tiny_lm import tiny_lm
from transformers import Qwen2ForCausalLM

from taurl.credit import prm as prm_math  # by module: the mutation check patches its function
from taurl.credit.batch import TurnBatch
from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.policy.logprobs import sequence_logprobs
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.prm import ImplicitPRM, PRMConfig

V = 64
PROMPT = [5, 6, 7]
GOOD = [10, 11, 12]  # the successful episode's first action (φ learns to like it)
BAD = [20, 21, 22]  # the failed episode's first action
OBS = [3, 4]
END = [30, 31]  # the answer action


def _model() -> Qwen2ForCausalLM:
    return tiny_lm(V, max_positions=256)


def _traj(
    model, name: str, actions: list[list[int]], reward: float, group: str = "t1"
) -> Trajectory:
    """An episode of `actions`, an observation after each but the last; behaviour logprobs
    are `model`'s own in context (on-policy), as the engine records them."""
    segs: list[tuple[str, list[int]]] = [("prompt", PROMPT)]
    for k, a in enumerate(actions):
        segs.append(("action", a))
        if k < len(actions) - 1:
            segs.append(("observation", OBS))
    ids = [i for _, s in segs for i in s]
    lp = sequence_logprobs(model, ids).tolist()
    segments, turns, pos = [], [], 0
    for kind, s in segs:
        logprobs = tuple(lp[pos:pos + len(s)]) if kind == "action" else None
        segments.append(Segment(kind, tuple(s), logprobs, 0 if kind == "action" else None))
        pos += len(s)
    action_idx = [i for i, (k, _) in enumerate(segs) if k == "action"]
    for t, si in enumerate(action_idx):
        obs = si + 1 if si + 1 < len(segs) else None
        turns.append(
            Turn(
                t, "a", {"kind": "search" if t < len(actions) - 1 else "answer"},
                "o" if obs else "", si, obs, "stop", env_reward=reward if obs is None else 0.0,
            )
        )
    return Trajectory(
        episode_id=name,
        run_id="r",
        task_id=group,
        group_id=group,
        split="train",
        env_name="toy-v0",
        env_version="0",
        seed=0,
        segments=tuple(segments),
        turns=tuple(turns),
        messages=({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}),
        terminated=True,
        truncated=False,
        stop_reason=StopReason.ANSWERED,
        reward=reward,
        reward_components={"outcome": reward},
    )


@pytest.fixture(scope="module")
def scored():
    """φ trained on (success, failure) of task t1; then every variant scored by it."""
    policy = _model()
    success = _traj(policy, "s", [GOOD, END], 1.0)
    failure = _traj(policy, "f", [BAD, END], 0.0)
    prm = ImplicitPRM(policy, PRMConfig(weight=1.0, clip=0.2, beta=0.5, lr=3e-2, steps=25))
    stats = prm.train([success, failure], np.array([1.0, 0.0]), np.array([0, 0]))
    variants = {
        "success": success,
        "padded": _traj(policy, "p", [GOOD, GOOD, GOOD, GOOD, GOOD, GOOD, END], 1.0),  # repetition
        "noop": _traj(policy, "n", [GOOD, [2], [2], [2], END], 1.0),  # no-op steps
        "failure": failure,
        # looks like success, fails
        "failed_imitation": _traj(policy, "fi", [GOOD] * 8 + [BAD, END], 0.0),
    }
    trajs = list(variants.values())
    batch = TurnBatch.from_trajectories(trajs)
    q = prm.config.beta * prm.log_ratios(trajs, batch.max_turns)
    return variants, batch, q, prm, stats


def _totals(batch: TurnBatch, q: np.ndarray, names: list[str]) -> dict[str, float]:
    shaped, _ = prm_math.episode_neutral_shaping(q, batch.turn_mask, weight=1.0, clip=0.2)
    totals = batch.replace(process_rewards=shaped).scores  # outcome + Σ_t shaping
    return dict(zip(names, totals.tolist(), strict=True))


def test_phi_learned_to_like_the_successful_first_action(scored):
    """The premise: without it the canary would pass for want of a temptation."""
    variants, batch, q, _, stats = scored
    assert stats["learn/prm_steps"] == 25 and stats["learn/prm_pairs"] == 1
    assert stats["learn/prm_dpo_reward_acc"] == 1.0
    names = list(variants)
    padded = q[names.index("padded")]
    assert (padded[:6] > 0.2).all()  # every repeated GOOD step would be paid the full clip
    assert q[names.index("failure"), 0] < 0  # and the failure's BAD step is disliked


@pytest.mark.attack
def test_padding_or_repetition_never_raises_the_shaped_reward(scored):
    variants, batch, q, _, _ = scored
    total = _totals(batch, q, list(variants))
    assert total["padded"] <= total["success"] + 1e-12
    assert total["noop"] <= total["success"] + 1e-12


@pytest.mark.attack
def test_a_failed_episode_never_ends_above_a_successful_one(scored):
    variants, batch, q, _, _ = scored
    total = _totals(batch, q, list(variants))
    worst_success = min(total[k] for k in ("success", "padded", "noop"))
    assert max(total["failure"], total["failed_imitation"]) < worst_success


@pytest.mark.attack
def test_the_shaped_return_is_the_outcome_and_the_ledger_reward_is_untouched(scored):
    """Through the learner: ``process_rewards`` carry the shaping, ``rewards`` the outcome."""
    variants, batch, _, prm, _ = scored
    trajs = list(variants.values())
    before = [t.reward for t in trajs]
    learner = Learner(_model(), LearnerConfig(estimator="istar", lr=1e-3), shaper=prm)
    a = learner.assign(trajs)
    assert np.abs(a.batch.process_rewards).max() > 0.05  # the scorer did shape
    np.testing.assert_allclose(a.batch.scores, [1, 1, 1, 0, 0], atol=1e-12)  # outcome + 0
    assert [t.reward for t in trajs] == before
    assert "learn/prm_shaping_abs_per_turn" in a.credit.stats


def test_the_shaping_stays_small_and_clipped(scored):
    variants, batch, q, _, _ = scored
    shaped, stats = prm_math.episode_neutral_shaping(q, batch.turn_mask, weight=1.0, clip=0.2)
    assert np.abs(shaped).max() <= 0.4 + 1e-12  # |p| <= 2c
    assert stats["learn/prm_clip_frac"] > 0  # the liked steps hit the clip
    assert (shaped[~batch.turn_mask] == 0).all()
