"""Token-exact rollouts on the real search env (docs/design.md#token-exact invariants).

The policy is the real default one: a corpus-trained BPE tokenizer and a tiny Qwen2,
briefly fine-tuned on expert demonstrations so that its samples contain searches,
answers and invalid actions. Every invariant is checked on its sampled rollouts.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from taurl import envs
from taurl.data.ledger import Ledger
from taurl.data.trajectory import StopReason, validate_trajectory
from taurl.envs.search import generate_tasks
from taurl.envs.search.expert import search_expert
from taurl.policy.engine import LocalEngine
from taurl.policy.files import save_policy
from taurl.policy.model import build_default_policy, load_policy
from taurl.rollout.loop import RolloutConfig, run_episode, run_episodes
from taurl.rollout.synth import ScriptedEngine
from taurl.train.sft import train_sft

TEMPERATURE = 1.0
ENV = {"top_k": 2, "max_doc_chars": 160}  # short observations keep the test's SFT cheap


class RecordingEngine:
    """Wraps an engine and keeps every (prompt_ids, generation) it served."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[list[int], object]] = []

    @property
    def version(self):
        return self.inner.version

    @property
    def max_context(self):
        return self.inner.max_context

    async def generate(self, prompt_ids, sampling):
        gen = await self.inner.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), gen))
        return gen


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """Default tiny policy, SFT'd for a few steps on expert demos, saved as HF (v1)."""
    from taurl.envs.search import build_corpus

    path = tmp_path_factory.mktemp("policy")
    texts = (
        [d.text for d in build_corpus()[::4]]
        + [t.prompt for t in generate_tasks("train", n=2000, seed=0)]
        + [envs.make("search-v0").system_prompt] * 10
    )
    model, tok = build_default_policy(texts, path / "v0", size="tiny", seed=0)
    tasks = generate_tasks("train", n=128, seed=1)

    async def demos():
        return [
            await run_episode(
                ScriptedEngine(tok, search_expert(t, random.Random(i))),
                envs.make("search-v0", **ENV), tok, t, seed=i,
            )
            for i, t in enumerate(tasks)
        ]

    trajs = asyncio.run(demos())
    # scripted actions are no policy's: no behaviour logprobs, no version (SFT needs neither)
    assert all(t.source == "scripted" and t.policy_versions == [] for t in trajs)
    torch.manual_seed(0)
    train_sft(model, trajs, epochs=3, batch_size=16, lr=5e-3, pad_id=tok.pad_token_id)
    save_policy(model, tok, path / "v1", {"policy_version": 1})
    return path / "v1"


@pytest.fixture(scope="module")
def sampled(policy_dir):
    model, tok = load_policy(policy_dir)
    engine = RecordingEngine(LocalEngine(model, tok, version=1))
    tasks = generate_tasks("train", n=24, seed=7)
    cfg = RolloutConfig(temperature=TEMPERATURE, max_action_tokens=48, max_turns=4)
    result = asyncio.run(
        run_episodes(
            engine, lambda: envs.make("search-v0", **ENV), tok, tasks, group_size=2, config=cfg,
            concurrency=16, seed=3,
        )
    )
    assert not result.failures
    return result.trajectories, engine.calls, tok


def test_rollouts_cover_every_kind_of_turn(sampled):
    trajs, _, _ = sampled
    kinds = {t.action.get("kind") for tr in trajs for t in tr.turns}
    assert {"search", "answer", "invalid"} <= kinds, kinds
    assert any(tr.reward == 1.0 for tr in trajs) or any(
        t.action.get("kind") == "answer" for tr in trajs for t in tr.turns
    )


def test_every_trajectory_keeps_the_contracts(sampled):
    trajs, _, _ = sampled
    fingerprint = envs.make("search-v0").retriever.fingerprint
    for tr in trajs:
        validate_trajectory(tr)
        assert tr.terminated != tr.truncated
        assert tr.source == "policy" and tr.policy_versions == [1]  # the engine served version 1
        assert tr.provenance == {"corpus_fingerprint": fingerprint}


def test_decoded_ids_equal_the_chat_rendering_of_the_messages(sampled):
    trajs, _, tok = sampled
    for tr in trajs:
        rendered = tok.apply_chat_template(list(tr.messages), tokenize=False)
        assert tok.decode(tr.token_ids, skip_special_tokens=False) == rendered


def test_mask_is_one_exactly_on_the_sampled_ids(sampled):
    trajs, calls, _ = sampled
    by_prefix: dict[tuple, list] = {}  # episodes of one group share their first prompt
    for prompt, gen in calls:
        by_prefix.setdefault(tuple(prompt), []).append(gen)
    for tr in trajs:
        ids, mask = tr.token_ids, tr.action_mask
        pos, expected_mask = 0, []
        for seg in tr.segments:
            if seg.kind == "action":
                # token in: the engine was called with exactly the ids before this segment
                served = [(g.token_ids, g.logprobs) for g in by_prefix[tuple(ids[:pos])]]
                assert (list(seg.token_ids), list(seg.logprobs)) in served
            expected_mask += [seg.mask] * len(seg.token_ids)
            pos += len(seg.token_ids)
        assert mask == expected_mask
        assert sum(mask) == sum(len(s.token_ids) for s in tr.segments if s.kind == "action")
    # and every sampled id is in some trajectory's action segments, once
    n_sampled = sum(len(g.token_ids) for _, g in calls)
    assert n_sampled == sum(sum(tr.action_mask) for tr in trajs)


def test_behaviour_logprobs_match_a_plain_forward_of_the_saved_checkpoint(sampled, policy_dir):
    trajs, _, _ = sampled
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    worst = 0.0
    for tr in trajs:
        ids = torch.tensor([tr.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float()
        lp = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        mask = torch.tensor(tr.action_mask[1:], dtype=torch.bool)
        recorded = torch.tensor(tr.logprobs[1:])
        worst = max(worst, float((lp[mask] - recorded[mask]).abs().max()))
    assert worst <= 1e-4, worst


def test_observations_are_encoded_once_and_masked(sampled):
    trajs, _, tok = sampled
    for tr in trajs:
        for turn in tr.turns:
            if turn.observation_segment is not None:
                seg = tr.segments[turn.observation_segment]
                assert seg.mask == 0 and seg.logprobs is None
                assert (
                    tok.decode(list(seg.token_ids), skip_special_tokens=False)
                    == turn.observation_text
                )


def test_auto_tokenizer_of_the_checkpoint_reproduces_the_ids(sampled, policy_dir):
    trajs, _, tok = sampled
    auto = AutoTokenizer.from_pretrained(policy_dir)
    for tr in trajs[:8]:
        text = tok.decode(tr.segments[0].token_ids, skip_special_tokens=False)
        assert auto(text, add_special_tokens=False)["input_ids"] == list(tr.segments[0].token_ids)


def test_ledger_accepts_every_sampled_trajectory(sampled, tmp_path):
    trajs, _, _ = sampled
    with Ledger(tmp_path / "l.sqlite") as ledger:
        report = ledger.append_many(trajs)
        assert not report.rejected
        assert ledger.count() == len(trajs)


def test_same_seed_same_trajectory(policy_dir):
    model, tok = load_policy(policy_dir)
    task = generate_tasks("train", n=1, seed=11)[0]

    async def once():
        return await run_episode(LocalEngine(model, tok), envs.make("search-v0"), tok, task, seed=5)

    a, b = asyncio.run(once()), asyncio.run(once())
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


# ---------------------------------------------------------------------------------------
# Bad input inside the loop: an observation plus a counted invalid action or error,
# and the right stop reason. Scripted actions go through the same loop as sampled ones.


@pytest.fixture(scope="module")
def tok(policy_dir):
    return load_policy(policy_dir)[1]


def _play(tok, actions, env=None, config=None, task=None):
    task = task or generate_tasks("train", n=1, seed=2)[0]
    config = config or RolloutConfig()
    return asyncio.run(
        run_episode(
            ScriptedEngine(tok, actions), env or envs.make("search-v0"), tok, task, seed=0,
            config=config,
        )
    )


@pytest.mark.parametrize(
    "bad", ["<foo>x</foo>", "<search>unclosed", "<search>   </search>", "no tags at all"]
)
def test_malformed_action_is_an_invalid_turn_with_the_corrective_observation(tok, bad):
    tr = _play(tok, [bad, "<answer>x</answer>"])
    assert tr.turns[0].invalid and "My previous action is invalid" in tr.turns[0].observation_text
    assert tr.num_invalid_actions == 1
    assert tr.stop_reason is StopReason.ANSWERED and tr.terminated
    validate_trajectory(tr)


def test_retriever_that_raises_is_counted_and_ends_the_episode_as_error(tok):
    class Broken:
        def search(self, query, k):
            raise OSError("index unavailable")

    env = envs.make("search-v0", retriever=Broken())
    tr = _play(tok, ["<search>a</search>"] * 4, env=env)
    assert tr.num_errors >= 1 and all("index unavailable" in (t.error or "") for t in tr.turns)
    assert tr.stop_reason is StopReason.ERROR and tr.truncated and not tr.valid
    validate_trajectory(tr)


def test_env_that_crashes_ends_the_episode_not_the_run(tok):
    env = envs.make("search-v0")
    env.step = lambda action: 1 / 0
    tr = _play(tok, ["<search>a</search>"], env=env)
    assert tr.stop_reason is StopReason.ERROR and "ZeroDivisionError" in tr.turns[0].error
    validate_trajectory(tr)


def test_env_reset_that_raises_is_a_record_with_the_error_not_a_raw_exception(tok, tmp_path):
    """Before: `env.reset` raising escaped `run_episode` and the episode left no record."""
    env = envs.make("search-v0")

    def reset(task, seed):
        raise KeyError("the task's document store is gone")

    env.reset = reset
    tr = _play(tok, ["<search>a</search>"], env=env)
    assert tr.stop_reason is StopReason.ERROR and tr.truncated and not tr.turns
    assert (
        "env.reset raised KeyError" in tr.metadata["error"]
        and "document store" in tr.metadata["error"]
    )
    validate_trajectory(tr)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        assert not ledger.append_many([tr]).rejected


@pytest.mark.parametrize("reward,info,words", [
    (None, None, "reward None (NoneType)"),
    ("1.0", None, "reward '1.0' (str)"),
    (float("nan"), None, "finite number"),
    (1.0, ["not", "a", "dict"], "info of type list"),
    (1.0, "oops", "info of type str"),
    (1.0, {"reward_components": {"outcome": "high"}}, "reward_components"),
])
def test_a_step_with_a_non_numeric_reward_or_a_non_dict_info_is_an_error_record(
    tok, tmp_path, reward, info, words
):
    """Before: `float(r)` / `info.get` raised out of `run_episode` (TypeError, AttributeError)."""
    env = envs.make("search-v0")
    real_step = env.step

    def step(action):
        obs, r, terminated, truncated, good = real_step(action)
        return obs, reward, terminated, truncated, good if info is None else info

    env.step = step
    tr = _play(tok, ["<search>a</search>", "<answer>x</answer>"], env=env)
    assert tr.stop_reason is StopReason.ERROR and tr.truncated and len(tr.turns) == 1
    assert "env contract" in tr.turns[0].error and words in tr.turns[0].error and tr.reward == 0.0
    validate_trajectory(tr)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        assert not ledger.append_many([tr]).rejected


def test_numpy_rewards_are_numbers(tok):
    import numpy as np

    env = envs.make("search-v0")
    real_step = env.step
    env.step = lambda action: (lambda o, r, te, tr, i: (o, np.float32(r), te, tr, i))(
        *real_step(action)
    )
    tr = _play(tok, ["<answer>x</answer>"], env=env)
    assert tr.stop_reason is StopReason.ANSWERED


def test_engine_failure_ends_the_episode_as_error(tok):
    from taurl.errors import EngineError

    class Failing(ScriptedEngine):
        async def generate(self, prompt_ids, sampling):
            raise EngineError("server went away")

    task = generate_tasks("train", n=1, seed=2)[0]
    tr = asyncio.run(run_episode(Failing(tok, []), envs.make("search-v0"), tok, task, seed=0))
    assert tr.stop_reason is StopReason.ERROR and "server went away" in tr.metadata["error"]
    validate_trajectory(tr)


@pytest.mark.parametrize("actions,config,reason", [
    (["<search>a</search>"] * 9, RolloutConfig(max_turns=9), StopReason.MAX_TURNS),  # env budget: 4
    (["<search>a</search>"] * 9, RolloutConfig(max_turns=2), StopReason.MAX_TURNS),  # loop budget
    ([], RolloutConfig(), StopReason.NO_ANSWER),  # EOS straight away
    (["<search>a</search>"] * 9, RolloutConfig(max_episode_tokens=5), StopReason.MAX_TOKENS),
    (["<search>Paris</search>"] * 9, RolloutConfig(max_context=200), StopReason.CONTEXT_FULL),
    (["<search>a</search>"] * 9, RolloutConfig(max_tool_calls=1), StopReason.TOOL_BUDGET),
])
def test_budgets_end_with_the_right_stop_reason(tok, actions, config, reason):
    tr = _play(tok, actions, config=config)
    assert tr.stop_reason is reason
    assert tr.truncated == (not reason.is_termination)
    validate_trajectory(tr)


def test_observation_is_cut_in_tokens_keeping_its_closing_tag(tok):
    tr = _play(
        tok,
        ["<search>Paris</search>", "<answer>x</answer>"],
        config=RolloutConfig(max_observation_tokens=24),
    )
    turn = tr.turns[0]
    assert turn.observation_tokens_dropped > 0
    assert len(tr.segments[turn.observation_segment].token_ids) == 24
    assert turn.observation_text.rstrip().endswith("</information>")


class RandomActionEngine:
    """Samples garbage and valid actions alike, so the loop meets every kind of input."""

    PIECES = [
        "<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<foo>", "Paris",
        "capital of ", " ", "\n", "é", "<information>", "123", "",
    ]

    def __init__(self, tok):
        self.tok = tok

    @property
    def version(self):
        return 0

    @property
    def max_context(self):
        return 2048

    async def generate(self, prompt_ids, sampling):
        from taurl.policy.engine import Generation

        rng = random.Random(hash(tuple(prompt_ids)) ^ (sampling.seed or 0))
        if rng.random() < 0.05:
            return Generation([self.tok.eos_token_id], [0.0], "eos", 0)
        text = "".join(rng.choice(self.PIECES) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.3:
            text += "<search>" + rng.choice(["Lyon", "", "France capital", "<b>"]) + "</search>"
        ids = self.tok(text, add_special_tokens=False)["input_ids"][: sampling.max_tokens] or [
            self.tok.pad_token_id
        ]
        return Generation(ids, [-1.0] * len(ids), "stop", 0)


def test_a_thousand_episodes_of_bad_input_never_die(tok, tmp_path):
    class Flaky:
        def __init__(self):
            from taurl.envs.search import shared_retriever

            self.inner, self.rng = shared_retriever(), random.Random(0)

        def search(self, query, k):
            if self.rng.random() < 0.2:
                raise TimeoutError("retriever timed out")
            return self.inner.search(query, k)

    flaky = Flaky()
    tasks = generate_tasks("train", n=250, seed=4)
    result = asyncio.run(
        run_episodes(
            RandomActionEngine(tok), lambda: envs.make("search-v0", retriever=flaky), tok, tasks,
            group_size=4, concurrency=64,
        )
    )
    assert len(result.trajectories) == 1000 and not result.failures
    with Ledger(tmp_path / "l.sqlite") as ledger:
        assert not ledger.append_many(result.trajectories).rejected
    stops = {tr.stop_reason for tr in result.trajectories}
    assert {StopReason.NO_ANSWER, StopReason.MAX_TURNS} <= stops
    assert sum(tr.num_invalid_actions for tr in result.trajectories) > 100
    assert sum(tr.num_errors for tr in result.trajectories) > 10
    # every error is explained in its turn
    assert all(
        t.error
        for tr in result.trajectories
        for t in tr.turns
        if t.receipt and t.receipt.status == "error"
    )
