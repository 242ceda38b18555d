"""Holdout evaluation: Wilson intervals, pass@k, the independent verifier, holdout only."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from taurl import envs
from taurl.envs.search import generate_tasks
from taurl.errors import Error
from taurl.evaluate import HoldoutVerifier, pass_at_k, summarize, wilson_interval
from taurl.policy.model import create_policy, save_policy
from taurl.rollout import run_episode
from taurl.synth import ScriptedEngine

ENV = {"top_k": 2, "max_doc_chars": 160}


def make_env():
    return envs.make("search-v0", **ENV)


@pytest.fixture(scope="module")
def tok(search_tokenizer):
    return search_tokenizer


@pytest.fixture(scope="module")
def holdout():
    return generate_tasks("holdout", n=6, seed=2, families=["city_country", "country_capital"])


def play(tok, task, actions, i=0):
    return asyncio.run(run_episode(ScriptedEngine(tok, actions), make_env(), tok, task, seed=i, episode_id=f"e{i}"))


def test_wilson_interval_hand_computed():
    # p = 0.5, n = 10, z = 1.96: centre 0.5, half 1.96·sqrt(0.025 + 0.0096)/1.384 = 0.2634
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    # p = 0: the lower end is exactly 0, the upper z²/(n + z²) = 3.8416/13.8416
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_pass_at_k_hand_computed():
    assert pass_at_k(3, 0, 3) == 0.0
    assert pass_at_k(3, 1, 3) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 − C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # pass@1 is the success rate
    with pytest.raises(Error):
        pass_at_k(2, 1, 3)


def test_summary_of_scripted_holdout_episodes(tok, holdout):
    trajs = []
    for i, t in enumerate(holdout):
        s, a = t.metadata["subject"], t.answers[0]
        right = [f"<think>a</think><search>{s}</search>", f"<think>b</think><answer>{a}</answer>"]
        wrong = ["<think>guess</think><answer>Atlantis</answer>"]
        # task i: trial 0 right with a search, trial 1 wrong without one; tasks 0-1 also a third, invalid, trial
        trajs += [play(tok, t, right, 10 * i), play(tok, t, wrong, 10 * i + 1)]
    r = summarize(trajs, holdout, trials=2)
    assert r.episodes == 12 and r.tasks == 6 and r.trials == 2
    assert r.success == pytest.approx(0.5) and r.pass_at_k == 1.0
    assert r.ci95 == pytest.approx(wilson_interval(6, 12))
    assert r.search_rate == pytest.approx(0.5) and r.tool_calls_mean == pytest.approx(0.5)
    assert r.invalid_rate == 0.0 and r.truncation_rate == 0.0 and r.verifier_disagreements == 0
    json.dumps(r.to_dict())  # summary.json material
    assert r.metrics()["eval/success"] == pytest.approx(0.5)


def test_verifier_rescores_from_the_answer_not_the_env_reward(tok, holdout):
    t = holdout[0]
    wrong = play(tok, t, ["<think>guess</think><answer>Atlantis</answer>"])
    tampered = dataclasses.replace(wrong, reward=1.0, reward_components={"outcome": 1.0})
    verifier = HoldoutVerifier()
    assert verifier(tampered, t) == 0.0 and verifier.calls == 1
    r = summarize([tampered], [t], trials=1, verifier=verifier)
    assert r.success == 0.0 and r.verifier_disagreements == 1


def test_truncated_and_invalid_episodes_are_counted(tok, holdout):
    t = holdout[1]
    bad = play(tok, t, ["no tags here", "still nothing", "nope", "again"])
    r = summarize([bad], [t], trials=1)
    assert r.success == 0.0 and r.invalid_rate == 1.0 and r.truncation_rate == 1.0
    assert r.stop_reasons == {"max_turns": 1.0}


def test_training_tasks_are_refused(tok):
    train = generate_tasks("train", n=1, seed=0)
    ep = play(tok, train[0], ["<think>x</think><answer>y</answer>"])
    with pytest.raises(Error, match="holdout"):
        summarize([ep], train, trials=1)


def test_evaluate_checkpoint_runs_k_trials_of_holdout_tasks(tok, tmp_path):
    from taurl.pipeline import PipelineConfig, evaluate_checkpoint, holdout_tasks

    save_policy(create_policy(tok, "tiny", seed=0), tok, tmp_path / "v0", {"policy_version": 0})
    cfg = PipelineConfig(eval_tasks=3, eval_trials=2, max_turns=1, max_action_tokens=4, max_episode_tokens=4,
                         families=["country_capital"], split_by="country")
    r = evaluate_checkpoint(tmp_path / "v0", cfg, progress=False)
    assert r.episodes == 6 and r.tasks == 3 and r.trials == 2 and r.policy_version == 0
    assert all(t.split == "holdout" for t in holdout_tasks(cfg))


def test_a_city_split_of_country_questions_says_how_to_fix_it():
    from taurl.errors import Error
    from taurl.pipeline import PipelineConfig, holdout_tasks

    with pytest.raises(Error, match="use a city family or split_by: country"):
        holdout_tasks(PipelineConfig(families=["country_capital"], split_by="city"))
