"""Evaluation: task-clustered intervals, pass@k, missing episodes, the env's own verifier."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json

import pytest

import taurl.eval.evaluate as evaluate_module
from taurl import envs
from taurl.envs import registry
from taurl.envs.search import generate_tasks
from taurl.envs.search.verifier import SearchVerifier
from taurl.envs.spec import EnvSpec
from taurl.errors import Error
from taurl.eval.evaluate import (
    EvalResult,
    OutcomeRewardVerifier,
    compare,
    default_verifier,
    summarize,
    verifier_name,
)
from taurl.eval.stats import (
    cluster_wilson_interval,
    design_effect,
    effective_sample_size,
    paired_difference,
    pass_at_k,
    t_quantile,
    wilson_interval,
)
from taurl.policy.files import save_policy
from taurl.policy.model import create_policy
from taurl.rollout.loop import run_episode
from taurl.rollout.synth import ScriptedEngine

ENV = {"top_k": 2, "max_doc_chars": 160}


def make_env():
    return envs.make("search-v0", **ENV)


@pytest.fixture(scope="module")
def tok(search_tokenizer):
    return search_tokenizer


@pytest.fixture(scope="module")
def holdout():
    return generate_tasks("holdout", n=6, seed=2, families=["city_country", "country_capital"])


@pytest.fixture(scope="module")
def ten(tok):
    """Ten holdout tasks, each with one right and one wrong answer episode (no search)."""
    tasks = generate_tasks("holdout", n=10, seed=3, families=["city_country", "country_capital"])
    assert len(tasks) == 10
    right = {t.task_id: play(tok, t, [f"<think>a</think><answer>{t.answers[0]}</answer>"], 2 * i)
             for i, t in enumerate(tasks)}
    wrong = {t.task_id: play(tok, t, ["<think>guess</think><answer>Atlantis</answer>"], 2 * i + 1)
             for i, t in enumerate(tasks)}
    return tasks, right, wrong


def play(tok, task, actions, i=0):
    return asyncio.run(
        run_episode(ScriptedEngine(tok, actions), make_env(), tok, task, seed=i, episode_id=f"e{i}")
    )


def copies(traj, k, tag):
    """`k` records of one played episode under distinct episode ids (trials of one task)."""
    return [dataclasses.replace(traj, episode_id=f"{tag}-{traj.task_id}-{j}") for j in range(k)]


# -- pure interval math ----------------------------------------------------------------

def test_wilson_interval_hand_computed():
    # p = 0.5, n = 10, z = 1.96: centre 0.5, half 1.96·sqrt(0.025 + 0.0096)/1.384 = 0.2634
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    # p = 0: the lower end is exactly 0, the upper z²/(n + z²) = 3.8416/13.8416
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_t_quantiles_match_the_table():
    # two-sided 95% Student-t quantiles (any statistics table)
    table = {
        1: 12.7062,
        2: 4.3027,
        3: 3.1824,
        4: 2.7764,
        5: 2.5706,
        9: 2.2622,
        29: 2.0452,
        99: 1.9842,
        100: 1.9840,
        101: 1.9837,
        1000: 1.9623,
    }
    for df, t in table.items():
        assert t_quantile(df) == pytest.approx(t, abs=1e-4), df
    assert t_quantile(9, conf=0.99) == pytest.approx(3.2498, abs=1e-4)
    with pytest.raises(Error):
        t_quantile(0)


def test_perfectly_correlated_trials_are_as_wide_as_one_draw_per_task():
    # 10 tasks × 10 trials, tasks 0-4 all success, 5-9 all failure: 100 episodes, 10
    # draws of information
    wins, sizes = [10] * 5 + [0] * 5, [10] * 10
    # CR1 variance 10/9 · 10·5²/100² = 0.02778 over the i.i.d. 0.25/100: deff
    # 11.1, clamped to m = 10
    assert design_effect(wins, sizes) == pytest.approx(10.0)
    # n* = 100/10 · (1.96/2.262157)² = 7.5070 (Korn–Graubard df = 9)
    assert effective_sample_size(wins, sizes) == pytest.approx(7.5070, abs=1e-4)
    lo, hi = cluster_wilson_interval(wins, sizes)
    # Wilson at n = 7.5070, p = 0.5: centre 0.5, half 1.96·sqrt(0.25/7.507 + 3.8416/(4·7.507²))/(1 +
    # 3.8416/7.507) = 0.2909
    assert (lo, hi) == pytest.approx((0.2091, 0.7909), abs=1e-4)
    # [0.404, 0.596]: what the interval would be if it ignored clustering
    iid = wilson_interval(50, 100)
    ten_draws = wilson_interval(5, 10)  # [0.237, 0.763]
    assert hi - lo >= ten_draws[1] - ten_draws[0] > 2.5 * (iid[1] - iid[0])


def test_independent_looking_trials_keep_the_iid_width_up_to_the_df_correction():
    # every task 1 of 2: no between-task spread, deff clamped up to 1, n* = 20 ·
    # (1.96/2.262157)² = 15.014
    wins, sizes = [1] * 10, [2] * 10
    assert design_effect(wins, sizes) == 1.0
    n_eff = effective_sample_size(wins, sizes)
    assert n_eff == pytest.approx(15.0137, abs=1e-3)
    assert cluster_wilson_interval(wins, sizes) == pytest.approx(
        wilson_interval(0.5 * n_eff, n_eff)
    )
    # with many tasks the df correction vanishes: 1000 tasks → within 0.2% of
    # the i.i.d. Wilson width
    lo, hi = cluster_wilson_interval([1] * 1000, [2] * 1000)
    a, b = wilson_interval(1000, 2000)
    assert (hi - lo) == pytest.approx(b - a, rel=2e-3)


def test_all_failures_take_the_conservative_design_effect():
    # p̂ = 0 leaves no spread to estimate the correlation from: deff = m, the interval of 10 tasks
    assert design_effect([0] * 10, [3] * 10) == 3.0
    lo, hi = cluster_wilson_interval([0] * 10, [3] * 10)
    n_eff = 10 * (1.96 / 2.262157) ** 2
    assert lo == 0.0 and hi == pytest.approx(1.96**2 / (n_eff + 1.96**2))  # z²/(n + z²) at p = 0
    assert hi > wilson_interval(0, 30)[1]
    # one task says nothing about a task population
    assert cluster_wilson_interval([1], [3]) == (0.0, 1.0)


def test_paired_difference_hand_computed():
    # d = [1/3, 1/3, 0, -1/3] (trials 3): mean 1/12, s² = Σ(d − 1/12)²/3 = (2·(1/4)² +
    # (1/12)² + (5/12)²)/3
    a = {"t1": 0, "t2": 1, "t3": 2, "t4": 3}
    b = {"t1": 1, "t2": 2, "t3": 2, "t4": 2}
    r = paired_difference(a, b, trials=3)
    s2 = (2 * 0.25**2 + (1 / 12) ** 2 + (5 / 12) ** 2) / 3
    half = 3.182446 * (s2 / 4) ** 0.5
    assert r.difference == pytest.approx(1 / 12)
    assert r.ci95 == pytest.approx((1 / 12 - half, 1 / 12 + half), abs=1e-5)
    assert (r.a_success, r.b_success, r.tasks) == (0.5, pytest.approx(7 / 12), 4)
    with pytest.raises(Error, match="same tasks"):
        paired_difference(a, {"t1": 0}, trials=3)


def test_pairing_removes_the_shared_task_difficulty():
    # 20 tasks of mixed difficulty; B solves exactly one more trial than A on every hard-ish task
    a = {f"t{i}": (0 if i < 10 else 3) for i in range(20)}
    b = {f"t{i}": (1 if i < 10 else 3) for i in range(20)}
    r = paired_difference(a, b, trials=3)
    assert r.difference == pytest.approx(1 / 6) and r.ci95[0] > 0  # a sure gain when paired
    # unpaired, the two clustered intervals overlap: the task-difficulty spread hides the gain
    ia = cluster_wilson_interval(list(a.values()), [3] * 20)
    ib = cluster_wilson_interval(list(b.values()), [3] * 20)
    assert ia[1] > ib[0]


def test_pass_at_k_hand_computed():
    assert pass_at_k(3, 0, 3) == 0.0
    assert pass_at_k(3, 1, 3) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 − C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # pass@1 is the success rate
    with pytest.raises(Error):
        pass_at_k(2, 1, 3)


# -- summarize ---------------------------------------------------------------------------

def test_summary_of_scripted_holdout_episodes(tok, holdout):
    trajs = []
    for i, t in enumerate(holdout):
        s, a = t.metadata["subject"], t.answers[0]
        right = [f"<think>a</think><search>{s}</search>", f"<think>b</think><answer>{a}</answer>"]
        wrong = ["<think>guess</think><answer>Atlantis</answer>"]
        # task i: trial 0 right with a search, trial 1 wrong without one
        trajs += [play(tok, t, right, 10 * i), play(tok, t, wrong, 10 * i + 1)]
    r = summarize(trajs, holdout, trials=2, verifier=SearchVerifier())
    assert r.episodes == 12 and r.tasks == 6 and r.trials == 2 and r.episodes_missing == 0
    assert r.success == pytest.approx(0.5) and r.pass_at_k == 1.0
    assert r.ci95_iid == pytest.approx(wilson_interval(6, 12))
    # every task 1 of 2: deff 1, so the clustered interval is Wilson at 12 · (1.96/t_5)² = 6.98
    assert r.design_effect == 1.0 and r.effective_n == pytest.approx(12 * (1.96 / 2.570582) ** 2)
    assert r.ci95 == pytest.approx(cluster_wilson_interval([1] * 6, [2] * 6))
    assert r.ci_method == "cluster-wilson-deff-kg"
    assert r.search_rate == pytest.approx(0.5) and r.tool_calls_mean == pytest.approx(0.5)
    assert r.invalid_rate == 0.0 and r.truncation_rate == 0.0 and r.verifier_disagreements == 0
    assert (r.verifier, r.verifier_version) == ("search-v0/exact-match", "em-v1")
    assert r.task_successes == {t.task_id: 1 for t in holdout}
    d = r.to_dict()
    json.dumps(d)  # summary.json material
    assert {
        "success", "ci95", "episodes", "tasks", "trials", "pass_at_k", "search_rate",
        "tool_calls_mean", "tokens_mean", "stop_reasons", "verifier_disagreements",
        "policy_version", "wall_s",
    } <= set(d)
    assert EvalResult.from_dict(json.loads(json.dumps(d))) == r
    assert r.metrics()["eval/success"] == pytest.approx(0.5) and "eval/ci95_iid_high" in r.metrics()


def test_the_clustered_interval_is_used_when_trials_are_perfectly_correlated(ten):
    # 10 tasks × 10 trials; tasks 0-4 solved every time, 5-9 never: 50/100 successes
    tasks, right, wrong = ten
    trajs = [
        x
        for i, t in enumerate(tasks)
        for x in copies((right if i < 5 else wrong)[t.task_id], 10, "c")
    ]
    r = summarize(trajs, tasks, trials=10, verifier=SearchVerifier())
    assert r.success == 0.5 and r.episodes == 100 and r.design_effect == pytest.approx(10.0)
    assert r.ci95 == pytest.approx((0.2091, 0.7909), abs=1e-4)  # hand-checked above
    assert r.ci95_iid == pytest.approx(wilson_interval(50, 100))
    width, iid_width = r.ci95[1] - r.ci95[0], r.ci95_iid[1] - r.ci95_iid[0]
    assert width > 2.5 * iid_width  # 0.58 vs 0.19: ten draws of information, not a hundred


def test_a_missing_episode_is_a_failure_and_never_shrinks_n(ten):
    tasks, right, _ = ten
    tasks = tasks[:4]
    # 4 tasks × 3 trials, all right
    trajs = [x for t in tasks for x in copies(right[t.task_id], 3, "m")]
    full = summarize(trajs, tasks, trials=3, verifier=SearchVerifier())
    assert full.success == 1.0 and full.episodes_missing == 0
    # lose two records of task 0 and every record of task 3 (5 of 12)
    kept = [
        x
        for x in trajs
        if not (
            x.task_id == tasks[3].task_id
            or x.episode_id in {f"m-{tasks[0].task_id}-0", f"m-{tasks[0].task_id}-1"}
        )
    ]
    r = summarize(kept, tasks, trials=3, verifier=SearchVerifier())
    assert (
        r.episodes == 12 and r.tasks == 4 and r.episodes_recorded == 7 and r.episodes_missing == 5
    )
    assert r.success == pytest.approx(7 / 12)  # not 7/7
    assert r.pass_at_k == pytest.approx(3 / 4)  # task 3 had no trial, so no success
    assert r.task_successes[tasks[0].task_id] == 1 and r.task_successes[tasks[3].task_id] == 0
    assert r.ci95 == pytest.approx(cluster_wilson_interval([1, 3, 3, 0], [3] * 4))
    assert r.ci95_iid == pytest.approx(wilson_interval(7, 12))
    # nothing recorded at all: every expected episode fails
    none = summarize([], tasks, trials=3, verifier=SearchVerifier())
    assert none.success == 0.0 and none.episodes == 12 and none.episodes_missing == 12


def test_more_records_than_trials_are_refused(ten):
    tasks, right, _ = ten
    with pytest.raises(Error, match="4 records for 3 trial"):
        summarize(
            copies(right[tasks[0].task_id], 4, "x"), tasks[:1], trials=3, verifier=SearchVerifier()
        )


def test_the_evaluator_scores_with_its_verifier_not_the_training_reward(tok, holdout):
    t = holdout[0]
    wrong = play(tok, t, ["<think>guess</think><answer>Atlantis</answer>"], 1)
    right = play(tok, t, [f"<think>a</think><answer>{t.answers[0]}</answer>"], 2)
    # the training reward says the opposite of the answers
    tampered = dataclasses.replace(wrong, reward=1.0, reward_components={"outcome": 1.0})
    unpaid = dataclasses.replace(right, reward=0.0, reward_components={"outcome": 0.0})
    verifier = SearchVerifier()
    assert verifier(tampered, t) == 0.0 and verifier(unpaid, t) == 1.0 and verifier.calls == 2
    r = summarize([tampered, unpaid], [t], trials=2, verifier=verifier)
    assert verifier.calls == 4  # the evaluator called the verifier it was given, once per record
    assert r.success == 0.5 and r.task_successes == {t.task_id: 1} and r.verifier_disagreements == 2
    # the same records through the training-outcome fallback: the edited rewards decide
    fb = summarize([tampered, unpaid], [t], trials=2, verifier=OutcomeRewardVerifier())
    assert fb.verifier == "training-outcome" and fb.verifier_disagreements == 0
    assert (
        fb.success == 0.5
        and summarize([tampered], [t], trials=1, verifier=OutcomeRewardVerifier()).success == 1.0
    )
    assert summarize([tampered], [t], trials=1, verifier=SearchVerifier()).success == 0.0


def test_any_verifier_object_is_used_and_recorded(tok, holdout):
    t = holdout[1]
    wrong = play(tok, t, ["<think>guess</think><answer>Atlantis</answer>"], 3)

    class Lenient:  # an env's own verifier: judges by something the training reward never saw
        name, version = "lenient", "l-7"

        def __call__(self, traj, task):
            return 1.0 if traj.turns[-1].action.get("answer") == "Atlantis" else 0.0

    r = summarize([wrong], [t], trials=1, verifier=Lenient())
    assert r.success == 1.0 and (r.verifier, r.verifier_version) == ("lenient", "l-7")

    class Broken:
        version = "b"

        def __call__(self, traj, task):
            return 2.0

    with pytest.raises(Error, match="score in"):
        summarize([wrong], [t], trials=1, verifier=Broken())
    with pytest.raises(Error, match="not a Verifier"):
        summarize([wrong], [t], trials=1, verifier=lambda traj, task: 1.0)


def test_the_default_verifier_is_the_registered_envs_own(tok, holdout, monkeypatch):
    t = holdout[2]
    wrong = play(tok, t, ["<think>guess</think><answer>Atlantis</answer>"], 4)
    tampered = dataclasses.replace(wrong, reward=1.0, reward_components={"outcome": 1.0})
    # an env registered with a verifier: summarize without one uses a fresh instance of it
    made = []

    def factory():
        made.append(SearchVerifier())
        return made[-1]

    monkeypatch.setitem(
        registry._SPECS, "evaltest-v0", EnvSpec("evaltest-v0", envs.make, verifier=factory)
    )
    mine = dataclasses.replace(tampered, env_name="evaltest-v0")
    r = summarize([mine], [t], trials=1)
    assert r.success == 0.0 and r.verifier == "search-v0/exact-match" and made[0].calls == 1
    # registered without one, or not registered: the training-outcome fallback, and it says so
    monkeypatch.setitem(registry._SPECS, "evaltest-v1", EnvSpec("evaltest-v1", envs.make))
    for name in ("evaltest-v1", "nowhere-v9"):
        assert isinstance(default_verifier(name), OutcomeRewardVerifier)
        r = summarize([dataclasses.replace(tampered, env_name=name)], [t], trials=1)
        assert r.verifier == "training-outcome" and r.success == 1.0
    assert verifier_name(default_verifier("search-v0")) in (
        "search-v0/exact-match",
        "training-outcome",
    )


def test_evaluate_names_no_env_verifier():
    src = inspect.getsource(evaluate_module)
    assert "exact_match" not in src and "taurl.envs.search" not in src


def test_compare_two_evaluations_of_the_same_tasks(ten):
    tasks, right, wrong = ten
    tasks = tasks[:6]
    a = summarize([x for t in tasks for x in copies(wrong[t.task_id], 2, "a")], tasks, trials=2,
                  verifier=SearchVerifier())
    b_trajs = [
        x
        for i, t in enumerate(tasks)
        for x in copies((right if i < 4 else wrong)[t.task_id], 2, "b")
    ]
    b = summarize(b_trajs, tasks, trials=2, verifier=SearchVerifier())
    d = compare(a, b)
    assert d.difference == pytest.approx(4 / 6) and d.tasks == 6
    assert d.ci95 == pytest.approx(paired_difference(a.task_successes, b.task_successes, 2).ci95)
    with pytest.raises(Error, match="same trials"):
        compare(a, dataclasses.replace(b, trials=3))


def test_old_evaluation_files_still_load():
    old = {
        "success": 0.5,
        "ci95": [0.4, 0.6],
        "episodes": 300,
        "tasks": 100,
        "trials": 3,
        "pass_at_k": 0.7,
        "search_rate": 0.9,
        "tool_calls_mean": 1.0,
        "tokens_mean": 80.0,
        "action_tokens_mean": 20.0,
        "turns_mean": 2.0,
        "invalid_rate": 0.0,
        "truncation_rate": 0.0,
        "stop_reasons": {},
        "verifier_disagreements": 0,
        "policy_version": 3,
        "wall_s": 1.0,
    }
    r = EvalResult.from_dict(old)
    assert r.ci95 == (0.4, 0.6) and r.task_successes == {}
    with pytest.raises(Error, match="unknown key"):
        EvalResult.from_dict({**old, "surprise": 1})


def test_truncated_and_invalid_episodes_are_counted(tok, holdout):
    t = holdout[1]
    bad = play(tok, t, ["no tags here", "still nothing", "nope", "again"])
    r = summarize([bad], [t], trials=1, verifier=SearchVerifier())
    assert r.success == 0.0 and r.invalid_rate == 1.0 and r.truncation_rate == 1.0
    assert r.stop_reasons == {"max_turns": 1.0} and r.invalid_episodes == 0


def test_training_tasks_are_refused(tok):
    train = generate_tasks("train", n=1, seed=0)
    ep = play(tok, train[0], ["<think>x</think><answer>y</answer>"])
    with pytest.raises(Error, match="holdout"):
        summarize([ep], train, trials=1)
    with pytest.raises(Error, match="validation"):
        summarize([ep], train, trials=1, split="validation")
    with pytest.raises(Error, match="never"):
        summarize([ep], train, trials=1, split="train")


def test_evaluate_policy_runs_k_trials_of_each_task_with_the_given_verifier(tok, tmp_path):
    from taurl.eval.eval_run import evaluate_policy
    from taurl.eval.evaluate import EvalConfig
    from taurl.rollout.loop import RolloutConfig

    save_policy(create_policy(tok, "tiny", seed=0), tok, tmp_path / "v0", {"policy_version": 0})
    tasks = generate_tasks("holdout", n=3, seed=0, families=["country_capital"])
    verifier = SearchVerifier()
    r = evaluate_policy(
        tmp_path / "v0",
        tasks,
        EvalConfig(tasks=3, trials=2, concurrency=6),
        make_env=lambda: envs.make("search-v0", max_turns=1, **ENV),
        rollout=RolloutConfig(max_turns=1, max_action_tokens=4, max_episode_tokens=4),
        verifier=verifier,
        progress=False,
    )
    assert r.episodes == 6 and r.tasks == 3 and r.trials == 2 and r.policy_version == 0
    assert r.episodes_recorded + r.episodes_missing == 6 and verifier.calls == r.episodes_recorded
    assert r.verifier == "search-v0/exact-match" and r.split == "holdout"
