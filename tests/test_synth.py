"""Demonstrations and rejection-sampling synthesis on the real search env and a real tokenizer."""

from __future__ import annotations

import asyncio
import random

import pytest

from taurl import envs
from taurl.envs.search import generate_tasks
from taurl.envs.search.expert import search_expert
from taurl.errors import ConfigError
from taurl.policy.engine import LocalEngine
from taurl.policy.model import create_policy
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.synth import (
    ExpertQuality,
    ScriptedEngine,
    SynthFilters,
    action_sequence,
    demonstrations,
    difficulty_bucket,
    is_complete,
    jaccard,
    rejection_sample,
    select_demonstrations,
)

ENV = {"top_k": 2, "max_doc_chars": 160}
ONE_HOP = ["city_country", "country_capital"]


def make_env():
    return envs.make("search-v0", **ENV)


@pytest.fixture(scope="module")
def tok(search_tokenizer):
    return search_tokenizer


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks("train", n=60, seed=3, families=ONE_HOP)


def scripted(tok, task, actions, seed=0):
    return asyncio.run(run_episode(ScriptedEngine(tok, actions), make_env(), tok, task, seed=seed,
                                   # the longest script: 3 searches, an answer
                                   config=RolloutConfig(max_turns=4),
                                   episode_id=f"s-{seed}"))


def test_perfect_expert_searches_and_answers_right(tok, tasks):
    demos = asyncio.run(demonstrations(tasks[:20], tok, make_env, expert=search_expert))
    assert [d.episode_id for d in demos] == [f"demo-{i}" for i in range(20)]
    assert all(d.source == "expert" and d.metadata["expert"] == "search_expert" for d in demos)
    assert all(d.num_tool_calls == 1 and d.reward == 1.0 for d in demos)
    assert all(is_complete(d) for d in demos)


def test_quality_knob_sets_the_share_of_demos_that_skip_search(tok, tasks):
    options = {"p_skip_search": 0.5, "p_guess_right": 0.0}
    demos = asyncio.run(
        demonstrations(tasks, tok, make_env, expert=search_expert, expert_options=options)
    )
    skipped = [d for d in demos if d.num_tool_calls == 0]
    assert 0.3 < len(skipped) / len(demos) < 0.7  # 60 draws of p = 0.5
    assert all(d.metadata["expert_options"] == options for d in demos)
    # a guess that is never right: every skipping demo fails, every searching one succeeds
    assert all(d.reward == 0.0 for d in skipped)
    assert all(d.reward == 1.0 for d in demos if d.num_tool_calls > 0)


def test_demonstrations_are_deterministic_and_the_earlier_quality_form_agrees(tok, tasks):
    options = {"p_skip_search": 0.5, "p_guess_right": 0.5}
    a = asyncio.run(
        demonstrations(
            tasks[:12], tok, make_env, expert=search_expert, expert_options=options, seed=4
        )
    )
    b = asyncio.run(
        demonstrations(tasks[:12], tok, make_env, quality=ExpertQuality(0.5, 0.5), seed=4)
    )
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert (
        [t.episode_id for t in a] == [t.episode_id for t in b] == [f"demo-{i}" for i in range(12)]
    )


def test_any_expert_plays_through_the_real_loop(tok, tasks):
    calls = []

    def answer_only(task, rng, *, guess="Atlantis"):  # another Expert: answers without searching
        calls.append(task.task_id)
        return [f"<think>{rng.random():.3f}</think><answer>{guess}</answer>"]

    demos = asyncio.run(demonstrations(tasks[:3], tok, make_env, expert=answer_only,
                                       expert_options={"guess": "Paris"}, episode_prefix="d"))
    assert calls == [t.task_id for t in tasks[:3]] and [d.episode_id for d in demos] == [
        "d-0",
        "d-1",
        "d-2",
    ]
    assert all(
        d.turns[0].action == {"kind": "answer", "answer": "Paris"} and d.terminated for d in demos
    )
    with pytest.raises(ConfigError, match="needs expert="):
        asyncio.run(demonstrations(tasks[:1], tok, make_env))
    with pytest.raises(ConfigError, match="returned str"):
        asyncio.run(
            demonstrations(tasks[:1], tok, make_env, expert=lambda t, rng: "<answer>x</answer>")
        )
    with pytest.raises(ConfigError, match="p_skip_search must be a probability"):
        search_expert(tasks[0], random.Random(0), p_skip_search=1.5)


def test_jaccard_hand_computed():
    # {s:a, a:x} vs {s:b, a:x}: 1 shared of 3 distinct
    assert jaccard(["search:a", "answer:x"], ["search:b", "answer:x"]) == pytest.approx(1 / 3)
    assert jaccard(["search:a"], ["search:a"]) == 1.0
    assert jaccard([], []) == 1.0
    assert jaccard(["a"], ["b"]) == 0.0


@pytest.mark.parametrize(
    ("rate", "bucket"),
    [
        (1.0, "easy"), (2 / 3, "easy"), (0.5, "medium"), (1 / 3, "medium"), (0.25, "hard"),
        (0.0, "unsolved"),
    ],
)
def test_difficulty_buckets(rate, bucket):
    assert difficulty_bucket(rate) == bucket


def test_filters_keep_only_correct_complete_efficient_diverse_episodes(tok, tasks):
    task = tasks[0]
    subject, answer = task.metadata["subject"], task.answers[0]
    good = f"<think>find {subject}</think>\n<search>{subject}</search>"
    final = f"<think>found</think>\n<answer>{answer}</answer>"
    episodes = [
        scripted(tok, task, [good, final], 1),  # kept
        scripted(tok, task, [good, final], 2),  # same actions: Jaccard 1 > 0.8, a duplicate
        # kept (diverse)
        scripted(tok, task, [f"<think>x</think><search>{subject} city</search>", final], 3),
        # 3 searches for a 1-hop task: inefficient
        scripted(tok, task, [good, good, good, final], 4),
        # no thought
        scripted(tok, task, [f"<search>{subject}</search>", f"<answer>{answer}</answer>"], 5),
        # wrong answer
        scripted(tok, task, [good, "<think>guess</think><answer>Atlantis</answer>"], 6),
    ]
    assert action_sequence(episodes[0]) == (f"search:{subject.lower()}", f"answer:{answer.lower()}")
    res = select_demonstrations(episodes, [task], SynthFilters(max_jaccard=0.8, per_task=5))
    assert [e.episode_id for e in res.kept] == ["s-1", "s-3"]
    s = res.stats
    assert (
        s["synth/rejected_duplicate"], s["synth/rejected_inefficient"],
        s["synth/rejected_incomplete"], s["synth/rejected_reward"],
    ) == (1, 1, 1, 1)
    assert s["synth/tasks_easy"] == 1  # 5 of 6 episodes answer right: rate 5/6 >= 2/3


def test_rejection_sampling_runs_a_real_policy_and_counts(tok, tasks):
    model = create_policy(tok, "tiny", seed=0)
    engine = LocalEngine(model, tok, max_batch_size=8)
    res = asyncio.run(rejection_sample(engine, tok, make_env, tasks[:2], k=2, seed=1,
                                       config=RolloutConfig(max_turns=1, max_action_tokens=4)))
    assert res.stats["synth/sampled"] == 4
    # an untrained policy never answers correctly: all rejected, the tasks are unsolved
    assert res.stats["synth/kept"] == 0 and res.stats["synth/tasks_unsolved"] == 2


def test_easy_cap_limits_the_share_of_easy_tasks(tok, tasks):
    eps = []
    for i, task in enumerate(tasks[:4]):
        s, a = task.metadata["subject"], task.answers[0]
        right = [f"<think>a</think><search>{s}</search>", f"<think>b</think><answer>{a}</answer>"]
        wrong = [
            f"<think>a</think><search>{s}</search>",
            "<think>b</think><answer>Atlantis</answer>",
        ]
        # tasks 0-2 easy (2 of 2 right), task 3 medium (1 of 2 right)
        eps += [
            scripted(tok, task, right, 10 * i),
            scripted(tok, task, right if i < 3 else wrong, 10 * i + 1),
        ]
    rng = random.Random(0)
    rng.shuffle(eps)
    res = select_demonstrations(
        eps, tasks[:4], SynthFilters(max_jaccard=1.0, per_task=2, max_easy_fraction=0.5)
    )
    assert res.stats["synth/tasks_easy"] == 3 and res.stats["synth/tasks_medium"] == 1
    # 1 medium episode kept → at most 1 easy one for a share of 1/2
    assert res.stats["synth/kept"] == 2 and res.stats["synth/rejected_easy_cap"] == 5


def test_concurrent_demonstrations_equal_sequential_ones(tok, tasks):
    options = {"p_skip_search": 0.5, "p_guess_right": 0.5}
    seq = asyncio.run(
        demonstrations(
            tasks[:16], tok, make_env, expert=search_expert, expert_options=options, seed=2,
            concurrency=1,
        )
    )
    par = asyncio.run(
        demonstrations(
            tasks[:16], tok, make_env, expert=search_expert, expert_options=options, seed=2,
            concurrency=6,
        )
    )
    assert [d.episode_id for d in par] == [f"demo-{i}" for i in range(16)]
    assert [(d.task_id, d.token_ids, d.action_mask, d.reward) for d in seq] == \
           [(d.task_id, d.token_ids, d.action_mask, d.reward) for d in par]
    with pytest.raises(ConfigError, match="concurrency must be an int >= 1"):
        asyncio.run(demonstrations(tasks[:1], tok, make_env, expert=search_expert, concurrency=0))


def test_a_scripted_engine_ends_its_turn_with_eos_when_out_of_actions_or_when_told_each_time(tok):
    """One engine for scripts: plain actions stop without EOS; eos_each (the proxy's expert
    replies, ReplyEngine) ends every one with EOS, cut to leave room for it."""
    from taurl.policy.protocol import SamplingParams
    from taurl.proxy.experts import ReplyEngine

    text = "<search>Paris</search>"
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    plain, replies = ScriptedEngine(tok, [text]), ReplyEngine(tok, [text])
    wide, narrow = SamplingParams(max_tokens=64), SamplingParams(max_tokens=n)
    first, last = asyncio.run(plain.generate([1], wide)), asyncio.run(plain.generate([1], wide))
    assert (first.finish_reason, len(first.token_ids)) == ("stop", n)
    assert (last.finish_reason, last.token_ids) == ("eos", [tok.eos_token_id])
    cut = asyncio.run(replies.generate([1], narrow))
    assert (cut.finish_reason, len(cut.token_ids), cut.token_ids[-1]) == (
        "eos",
        n,
        tok.eos_token_id,
    )
    assert replies.source == "expert" and asyncio.run(replies.generate([1], wide)).token_ids == [
        tok.eos_token_id
    ]
