"""`critic_warmup_updates`: the first k updates of `estimator: gae` fit only the critic.

A tiny Qwen2 policy and real two-turn records (a success and a failure of one task): during
the warm-up the critic's weights move and the policy's do not; after it, the policy steps.
The count survives a save/load of the critic, so a resumed run does not warm up again.
"""

from __future__ import annotations

import pytest
import torch
from tests.train._tiny_lm import tiny_lm
from transformers import Qwen2ForCausalLM

from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.errors import ConfigError
from taurl.policy.logprobs import sequence_logprobs
from taurl.train.learner import Learner, LearnerConfig

V = 64


def _model() -> Qwen2ForCausalLM:
    return tiny_lm(V, max_positions=256)


def _traj(model, name: str, actions: list[list[int]], reward: float) -> Trajectory:
    segs: list[tuple[str, list[int]]] = [("prompt", [5, 6, 7])]
    for k, a in enumerate(actions):
        segs.append(("action", a))
        if k < len(actions) - 1:
            segs.append(("observation", [3, 4]))
    ids = [i for _, s in segs for i in s]
    lp = sequence_logprobs(model, ids).tolist()
    segments, turns, pos = [], [], 0
    for kind, s in segs:
        segments.append(
            Segment(
                kind, tuple(s), tuple(lp[pos : pos + len(s)]) if kind == "action" else None,
                0 if kind == "action" else None,
            )
        )
        pos += len(s)
    action_idx = [i for i, (k, _) in enumerate(segs) if k == "action"]
    for t, si in enumerate(action_idx):
        obs = si + 1 if si + 1 < len(segs) else None
        turns.append(Turn(t, "a", {"kind": "move"}, "o" if obs else "", si, obs, "stop",
                          env_reward=reward if obs is None else 0.0))
    return Trajectory(
        episode_id=name, run_id="r", task_id="t1", group_id="t1", split="train", env_name="toy-v0",
        env_version="0", seed=0, segments=tuple(segments), turns=tuple(turns),
        messages=({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}),
        terminated=True, truncated=False, stop_reason=StopReason.ANSWERED, reward=reward,
        reward_components={"outcome": reward},
    )


def _params(m: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


def _moved(before: list[torch.Tensor], m: torch.nn.Module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))


def test_warmup_updates_train_only_the_critic(tmp_path):
    policy = _model()
    batch = [
        _traj(policy, "s", [[10, 11], [30, 31]], 1.0),
        _traj(policy, "f", [[20, 21], [30, 31]], 0.0),
    ]
    cfg = LearnerConfig(estimator="gae", estimator_options={"gamma": 0.95}, lr=1e-2, critic_lr=1e-2,
                        critic_warmup_updates=2)
    learner = Learner(policy, cfg)
    for k in (1, 2):
        pol, crit = _params(policy), _params(learner.critic.model)
        stats = learner.update(batch)
        assert stats["learn/critic_warmup"] == 1.0 and stats["learn/skipped"] == 1.0, k
        assert not _moved(pol, policy), f"warm-up update {k} stepped the policy"
        assert _moved(crit, learner.critic.model), f"warm-up update {k} did not train the critic"
        assert stats["learn/vf_loss"] > 0
    assert learner.critic.updates == 2
    pol = _params(policy)
    # the warm-up is over: a policy step on the fitted critic's advantages
    stats = learner.update(batch)
    assert "learn/critic_warmup" not in stats and stats["learn/skipped"] == 0.0
    assert _moved(pol, policy)

    # the count is saved with the critic: a learner restored from it does not warm up again
    learner.save_state(tmp_path)
    again = Learner(_model(), cfg)
    assert again.load_state(tmp_path) and again.critic.updates == 3
    pol = _params(again.model)
    assert "learn/critic_warmup" not in again.update(batch)
    assert _moved(pol, again.model)


def test_warmup_needs_a_critic():
    with pytest.raises(ConfigError, match="critic_warmup_updates"):
        Learner(_model(), LearnerConfig(estimator="grpo", critic_warmup_updates=1))
    with pytest.raises(ConfigError, match="critic_warmup_updates"):
        Learner(_model(), LearnerConfig(estimator="gae", critic_warmup_updates=-1))


def test_critic_epochs_sets_the_critics_steps_per_batch():
    policy = _model()
    batch = [
        _traj(policy, "s", [[10, 11], [30, 31]], 1.0),
        _traj(policy, "f", [[20, 21], [30, 31]], 0.0),
    ]
    learner = Learner(
        policy, LearnerConfig(estimator="gae", critic_epochs=3, critic_warmup_updates=1)
    )
    learner.update(batch)
    steps = {int(s["step"]) for s in learner.critic.optimizer.state.values()}
    # three AdamW steps of the critic on the one batch, the policy's epochs being 1
    assert steps == {3}
    assert LearnerConfig(estimator="gae").critic_config().epochs == 1  # 0: the policy's epochs
    with pytest.raises(ConfigError, match="critic_epochs"):
        Learner(_model(), LearnerConfig(estimator="gae", critic_epochs=-1))
