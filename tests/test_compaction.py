"""Context management in the agent loop (issue 30): a compaction or a template that rewrites
history begins a new token stream; every stream stays token-exact on its own."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
from pathlib import Path

import pytest
import torch

from taurl import envs
from taurl.data.chains import stream_views
from taurl.data.trajectory import StopReason, validate_trajectory
from taurl.envs.gym import frozenlake_expert, frozenlake_tasks
from taurl.errors import ConfigError
from taurl.policy.engine import LocalEngine
from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import create_policy
from taurl.policy.tokenizer import build_tokenizer
from taurl.recipe.config import RolloutRunConfig
from taurl.recipe.validate import load_config, option_problems
from taurl.rollout.compaction import CompactionConfig
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.stream import ChatCodec
from taurl.rollout.synth import ScriptedEngine
from taurl.train.chains import untrained_keep
from taurl.train.learner import Learner, LearnerConfig

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def lake():
    tasks = frozenlake_tasks("train", 12, size=8)
    texts = [t.prompt for t in tasks] + [
        a for t in tasks for a in frozenlake_expert(t, random.Random(0))
    ]
    tok = build_tokenizer(texts + ["Summarize the progress so far."] * 5, vocab_size=400)
    return tasks, tok


class Recording:
    """An engine that remembers what it was asked (the ids it read) and what it sampled."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, ids, sampling):
        gen = await self.engine.generate(ids, sampling)
        self.calls.append((list(ids), list(gen.token_ids)))
        return gen


def _config(policy: str, max_turns: int = 20, **kw) -> RolloutConfig:
    return RolloutConfig(
        max_turns=max_turns, max_action_tokens=8, max_episode_tokens=400, max_context=256,
        compaction=CompactionConfig(policy=policy, **kw),
    )


def _episode(engine, tok, task, config, seed=0):
    env = envs.make("frozenlake-v0", max_turns=config.max_turns)
    env.system_prompt = ""
    return validate_trajectory(
        asyncio.run(run_episode(engine, env, tok, task, seed=seed, config=config))
    )


def _renders_itself(tok, view) -> bool:
    codec = ChatCodec(tok)
    return codec.decode(view.token_ids) == codec.render(
        list(view.messages), add_generation_prompt=False
    )


@pytest.mark.parametrize("policy", ["drop", "truncate", "summarize", "env"])
def test_a_compacted_episode_is_token_exact_stream_by_stream(lake, policy):
    """A tiny random policy, sampled for real: each stream decodes to its own rendering, mask 1
    is exactly the sampled ids, every call read one stream, and the learner's logprobs of each
    stream, recomputed on its own ids, are the behaviour logprobs within 1e-4."""
    tasks, tok = lake
    model = create_policy(tok, "tiny", seed=0).eval()
    engine = Recording(LocalEngine(model, tok, version=0, seed=0))
    tr = _episode(
        engine, tok, tasks[0], _config(policy, max_turns=6, keep_turns=0, summary_tokens=8)
    )
    views = stream_views(tr)
    assert tr.num_streams >= 3 and {s.reason for s in tr.stream_starts} == {"compaction"}, (
        tr.stop_reason
    )
    assert all(len(v.token_ids) <= 256 for v in views)
    assert all(_renders_itself(tok, v) for v in views)
    sampled = [i for _, ids in engine.calls for i in ids]
    assert [
        t for v in views for t, m in zip(v.token_ids, v.action_mask, strict=True) if m
    ] == sampled
    for prompt, ids in engine.calls:  # the engine read a prefix of exactly one stream
        assert sum(v.token_ids[:len(prompt) + len(ids)] == prompt + ids for v in views) == 1
    for v in views:
        lp = sequence_logprobs(model, v.token_ids)
        on = torch.tensor(v.action_mask, dtype=torch.bool)
        assert torch.allclose(lp[on], torch.tensor(v.behaviour_logprobs)[on], atol=1e-4)
    if policy == "summarize":
        summaries = [t for t in tr.turns if t.action["kind"] == "summary"]
        # one per compaction that had room to ask for it (a stream too full goes on without)
        assert 1 <= len(summaries) <= tr.num_streams - 1 and all(
            t.action["trained"] for t in summaries
        )


def test_compaction_finishes_the_episodes_a_small_context_truncates(lake):
    """The shortest-path expert on 8x8 maps (14+ moves) with 256 tokens of context: without
    compaction every episode ends context_full; with the env's hook every one reaches the goal."""
    tasks, tok = lake
    for task in tasks[:4]:
        moves = frozenlake_expert(task, random.Random(0))
        cut = _episode(ScriptedEngine(tok, moves), tok, task, _config("none"))
        assert cut.stop_reason is StopReason.CONTEXT_FULL and cut.truncated and cut.num_streams == 1
        done = _episode(ScriptedEngine(tok, moves), tok, task, _config("env"))
        assert done.stop_reason == "goal" and done.reward == 1.0 and done.num_streams >= 2
        assert all(_renders_itself(tok, v) for v in stream_views(done))
        # the new prompt states where the walk stands: the cell the last move reached
        second = stream_views(done)[1]
        assert second.messages[-2]["content"].endswith(
            done.turns[len(stream_views(done)[0].turns) - 1].observation_text.strip()
        )


def _masked_summaries(lake):
    tasks, tok = lake
    moves = frozenlake_expert(tasks[1], random.Random(0))
    config = RolloutConfig(
        max_turns=20,
        max_action_tokens=8,
        max_episode_tokens=400,
        max_context=256,
        compaction=CompactionConfig(
            policy="summarize", summary="masked", keep_turns=1, trigger=0.55, summary_tokens=4
        ),
    )
    return _episode(ScriptedEngine(tok, moves, source="scripted"), tok, tasks[1], config)


def test_a_masked_summary_is_sampled_recorded_and_kept_off_the_loss(lake):
    tr = _masked_summaries(lake)
    # the script is not asked for the summaries: its moves stay its moves
    assert tr.stop_reason == "goal", tr.stop_reason
    summaries = [t for t in tr.turns if t.action["kind"] == "summary"]
    assert summaries and all(t.action == {"kind": "summary", "trained": False} for t in summaries)
    for view in stream_views(tr):
        keep = untrained_keep(view)
        for t in view.turns:
            seg = view.segments[t.action_segment]
            start = sum(len(s.token_ids) for s in view.segments[:t.action_segment])
            assert set(keep[start : start + len(seg.token_ids)]) <= (
                {0.0} if t.action["kind"] == "summary" else {1.0}
            )


def test_sft_and_export_keep_a_masked_summary_off_the_loss(lake):
    """`summary: masked` holds in SFT (its ids are not targets) and in the export (loss_mask
    0 on them, action_mask still 1: they were sampled)."""
    from taurl.data.export import check_export_fields, export_row
    from taurl.train.sft import sft_step

    tr, (_, tok) = _masked_summaries(lake), lake
    summary_ids = sum(len(tr.segments[t.action_segment].token_ids) for t in tr.turns
                      if t.action["kind"] == "summary")
    assert summary_ids > 0
    model = create_policy(tok, "tiny", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    out = sft_step(model, opt, [tr], pad_id=tok.pad_token_id)
    assert out["sft/action_tokens"] == tr.num_action_tokens - summary_ids
    row = export_row(tr)
    assert sum(row["action_mask"]) == tr.num_action_tokens
    assert sum(row["loss_mask"]) == tr.num_action_tokens - summary_ids
    assert not check_export_fields(row, tr)
    wrong = check_export_fields({**row, "loss_mask": row["action_mask"]}, tr)
    assert [e.rule for e in wrong] == ["mask_mismatch"]


def test_expert_demonstrations_that_summarize_stay_the_experts_walk(lake):
    """A summary request is not an env move: the expert's script is never asked for one (it
    would spend a move and shift the rest, walking into holes). Every demonstration reaches
    the goal, its moves are the expert's in order, and each summary is the loop's own (the
    last observation, so it says where the walk stands)."""
    from taurl.rollout.synth import demonstrations

    tasks, tok = lake
    config = _config("summarize", max_turns=30, keep_turns=1, summary_tokens=16)
    config = dataclasses.replace(config, max_episode_tokens=800)

    def make_env():
        env = envs.make("frozenlake-v0", max_turns=30)
        env.system_prompt = ""
        return env

    demos = asyncio.run(demonstrations(tasks[:6], tok, make_env, expert=frozenlake_expert,
                                       config=config))
    assert [d.stop_reason for d in demos] == ["goal"] * 6 and all(d.reward == 1.0 for d in demos)
    for i, (task, d) in enumerate(zip(tasks[:6], demos, strict=True)):
        validate_trajectory(d)
        moves = [t.action_text for t in d.turns if t.action["kind"] != "summary"]
        assert moves == frozenlake_expert(task, random.Random(f"0:{i}")) and d.num_streams >= 2
        summaries = [t for t in d.turns if t.action["kind"] == "summary"]
        assert summaries and all(s.action_text.startswith("<information>row ") for s in summaries)


def test_compaction_options_are_checked_before_any_work():
    def problems(options):
        return option_problems("rollout.compaction", CompactionConfig, options)

    assert problems({"policy": "fold"}) and problems({"trigger": 1.5})
    assert problems({"keep_turn": 1}) and problems({"summary": "maybe"})
    with pytest.raises(ConfigError, match="policy"):
        load_config(RolloutRunConfig, data={"compaction": {"policy": "fold"}})
    assert CompactionConfig(policy="env").on and not CompactionConfig().on


# ---------------------------------------------------------------------------------------
# A Qwen3-style template that strips earlier <think> blocks


class Guess:
    """A messages env whose answers are user messages (as a chat game would send): the first
    one makes the template drop the earlier <think> blocks. Three guesses; the third wins."""

    name, version, verifier_version = "guess-v0", "0", "0"
    observation_style, stop, tools, system_prompt = "messages", (), [], "Guess the number."

    def __init__(self, wins_at: int = 3, role: str = "user"):
        self.wins_at, self.role = wins_at, role

    def reset(self, task, seed=None):
        self.turn = 0
        return "", {}

    def step(self, action):
        self.turn += 1
        if self.turn == self.wins_at:
            return (
                "",
                1.0,
                True,
                False,
                {
                    "action": {"kind": "guess"},
                    "invalid": False,
                    "stop_reason": "answered",
                    "reward_components": {"outcome": 1.0},
                },
            )
        answer = (
            "Higher."
            if self.role == "user"
            else "Higher: the number is above your guess, so try a larger one."
        )
        return (
            answer, 0.0, False, False,
            {"action": {"kind": "guess"}, "invalid": False, "role": self.role},
        )


@pytest.fixture(scope="module")
def thinking():
    texts = ["<think>it is above 3</think>\n4 Higher. Guess the number. 7"] * 30
    tok = build_tokenizer(texts, vocab_size=300)
    tok.chat_template = (FIXTURES / "qwen3_think_template.jinja").read_text()
    from taurl.envs.core import Task

    return tok, Task(
        task_id="g0", prompt="A number from 1 to 9.", answers=(), split="train", env="guess-v0"
    )


class Thinking:
    """An engine whose actions think first: the script's ids with the behaviour logprobs the
    policy gives them on the ids it was asked about (what sampling them would record)."""

    source, max_context = "policy", 4096

    def __init__(self, model, tok, script):
        self.model, self.tok, self.script, self.calls = model, tok, list(script), []

    async def generate(self, ids, sampling):
        from taurl.policy.protocol import Generation

        out = list(self.tok(self.script.pop(0), add_special_tokens=False)["input_ids"])
        lp = sequence_logprobs(self.model, list(ids) + out)[len(ids):].tolist()
        self.calls.append((list(ids), out))
        return Generation(out, lp, "stop", 0, prompt_tokens=len(ids))


def test_a_think_stripping_template_trains_token_exact(thinking):
    """Re-rendering the conversation drops the earlier <think> blocks, so the loop never does:
    each user answer begins a new stream (reason template_rewrite) whose prompt is rendered
    once. Every stream decodes to its own rendering, the sampled ids (thinking included) are
    mask 1 where they were sampled, and the learner's recomputed logprobs match within 1e-4."""
    tok, task = thinking
    model = create_policy(tok, "tiny", seed=1).eval()
    config = RolloutConfig(
        max_turns=3, max_action_tokens=12, max_episode_tokens=64, max_context=256
    )
    trajs, engines = [], []
    for g, guesses in enumerate((("4", "6", "7"), ("5", "8", "9"))):
        engine = Thinking(
            model, tok, [f"<think>it is above {int(x) - 1}</think>\n{x}" for x in guesses]
        )
        trajs.append(
            validate_trajectory(
                asyncio.run(
                    run_episode(engine, Guess(), tok, task, seed=g, config=config, group_id="g")
                )
            )
        )
        engines.append(engine)
    codec = ChatCodec(tok)
    for tr, engine in zip(trajs, engines, strict=True):
        views = stream_views(tr)
        assert [s.reason for s in tr.stream_starts] == ["template_rewrite"] * 2
        assert all(_renders_itself(tok, v) for v in views)
        sampled = [i for _, ids in engine.calls for i in ids]
        assert [
            t for v in views for t, m in zip(v.token_ids, v.action_mask, strict=True) if m
        ] == sampled
        for (prompt, ids), v in zip(engine.calls, views, strict=True):  # call k read stream k
            assert v.token_ids[:len(prompt) + len(ids)] == prompt + ids
        # the later prompts were rendered with the earlier thinking stripped; each
        # action keeps its own
        assert "<think>" not in codec.decode(views[1].segments[0].token_ids)
        assert "<think>" in codec.decode(views[1].segments[1].token_ids)
        # the one-stream alternative is not token-exact: the whole conversation re-rendered has
        # lost the thinking the model sampled in its first action
        first = codec.decode(views[0].segments[1].token_ids)
        assert "<think>" in first and first not in codec.render(list(views[-1].messages), False)
    rewarded = [dataclasses.replace(t, reward=r, reward_components={"outcome": r})
                for t, r in zip(trajs, (1.0, 0.0), strict=True)]
    out = Learner(copy.deepcopy(model), LearnerConfig(lr=1e-3)).update(rewarded)
    assert out["learn/skipped"] == 0.0 and out["mismatch/abs_max"] < 1e-4


@pytest.mark.parametrize(
    ("policy", "keep", "context"), [("drop", 1, 256), ("truncate", 0, 320), ("summarize", 0, 256)]
)
def test_a_chat_env_compacts_into_streams_that_render_themselves(policy, keep, context):
    """A messages-style env (each answer a tool message): the compacted prompt is the task and
    the kept (assistant, tool) exchanges, rendered once; the episode reaches its end."""
    texts = [
        "Guess the number. A number from 1 to 9. Higher: the number is above your guess, so try a "
        "larger one. I guess 5. Summarize the progress so far."
    ] * 30
    tok = build_tokenizer(texts, vocab_size=300)
    from taurl.envs.core import Task

    task = Task(
        task_id="g0", prompt="A number from 1 to 9.", answers=(), split="train", env="guess-v0"
    )
    config = RolloutConfig(
        max_turns=12,
        max_action_tokens=8,
        max_episode_tokens=200,
        max_context=context,
        compaction=CompactionConfig(
            policy=policy, keep_turns=keep, truncate_tokens=2, summary_tokens=6
        ),
    )
    script = [f"I guess {k}" for k in range(1, 16)]
    tr = validate_trajectory(
        asyncio.run(
            run_episode(
                ScriptedEngine(tok, script), Guess(wins_at=6, role="tool"), tok, task, seed=0,
                config=config,
            )
        )
    )
    assert tr.stop_reason == "answered" and tr.num_streams >= 2, tr.stop_reason
    views = stream_views(tr)
    assert all(_renders_itself(tok, v) for v in views) and all(
        len(v.token_ids) <= context for v in views
    )
    second = views[1].messages  # system, task, the kept exchanges, then the stream's own turns
    answer = tr.turns[0].observation_text
    if policy == "drop":
        assert [m["role"] for m in second[2:4]] == ["assistant", "tool"] and second[3][
            "content"
        ] in answer
    elif policy == "truncate":
        assert second[2]["role"] == "assistant" and len(second[3]["content"]) < 20 < len(answer)
    else:
        assert (
            second[1]["content"].startswith(task.prompt + "\n") and second[2]["role"] == "assistant"
        )
        assert any(t.action["kind"] == "summary" for t in tr.turns)


def test_a_chat_summary_keeps_the_last_real_exchange():
    """messages env, summarize, keep_turns 1: the new prompt keeps the last (action, answer)
    exchange, never the summary's (empty assistant, request) pair, so the policy is not asked
    to summarize again at the start of the next stream."""
    texts = ["Guess the number. A number from 1 to 9. Higher: the number is above your guess, "
             "so try a larger one. I guess 5. Summarize the progress so far."] * 30
    tok = build_tokenizer(texts, vocab_size=300)
    from taurl.envs.core import Task

    task = Task(task_id="g0", prompt="A number from 1 to 9.", answers=(), split="train",
                env="guess-v0")
    config = RolloutConfig(max_turns=12, max_action_tokens=8, max_episode_tokens=200,
                           max_context=256,
                           compaction=CompactionConfig(policy="summarize", keep_turns=1,
                                                       summary_tokens=6))
    script = [f"I guess {k}" for k in range(1, 16)]
    engine, env = ScriptedEngine(tok, script), Guess(wins_at=6, role="tool")
    tr = validate_trajectory(asyncio.run(run_episode(engine, env, tok, task, seed=0,
                                                     config=config)))
    assert tr.stop_reason == "answered" and tr.num_streams >= 2, tr.stop_reason
    request = config.compaction.summary_request
    for view in stream_views(tr)[1:]:
        kept = view.messages[2:4]  # system, task (+ summary), then the kept exchange
        assert [m["role"] for m in kept] == ["assistant", "tool"], kept
        assert kept[0]["content"].startswith("I guess ") and kept[1]["content"].startswith("Higher")
        assert all(m["content"] != request for m in view.messages[:4])


def test_a_checkpoints_recorded_compaction_is_read_back():
    """`taurl eval CHECKPOINT` rebuilds the budgets from the checkpoint's recipe (asdict of its
    RolloutConfig): a policy trained with compaction is evaluated with it."""
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.validate import load_config

    trained = load_config(
        TrainConfig, path=str(Path(__file__).parents[1] / "configs/long_horizon.yaml")
    )
    recorded = dataclasses.asdict(trained.rollout_config())["compaction"]
    again = load_config(TrainConfig, overrides={"env": "frozenlake-v0", "compaction": recorded})
    assert again.rollout_config().compaction == trained.rollout_config().compaction
    assert again.rollout_config().compaction.policy == "env"


# ---------------------------------------------------------------------------------------
# A compaction that fails, the summary's turn, the summary's end-of-turn token


def _lake_env(**attrs):
    env = envs.make("frozenlake-v0", max_turns=20)
    env.system_prompt = ""
    for k, v in attrs.items():
        setattr(env, k, v)
    return env


def test_a_raising_hook_or_template_ends_the_episode_with_its_record(lake):
    """The env's compact_prompt or the chat template raising while compacting: the episode is
    recorded, invalid (stop error) with the error, and counted in rollout/error_rate; the
    stream before the compaction is closed and token-exact."""
    from taurl.monitor.metrics import rollout_metrics

    tasks, tok = lake
    moves = frozenlake_expert(tasks[0], random.Random(0))

    def broken(task):
        raise RuntimeError("no map here")

    trs = []
    for env, t in ((_lake_env(compact_prompt=broken), tok),
                   (_lake_env(compact_prompt=lambda task: "BROKEN"), copy.deepcopy(tok))):
        if env.compact_prompt is not broken:  # a template that refuses the compacted prompt
            t.chat_template = ("{% for m in messages %}{% if m['content'] == 'BROKEN' %}"
                               "{{ raise_exception('this template refuses it') }}{% endif %}"
                               "{% endfor %}" + t.chat_template)
        tr = asyncio.run(run_episode(ScriptedEngine(t, moves), env, t, tasks[0], seed=0,
                                     config=_config("env")))
        trs.append(validate_trajectory(tr))
        assert tr.stop_reason is StopReason.ERROR and not tr.valid and tr.num_streams == 1
        assert _renders_itself(t, stream_views(tr)[0])
    assert "no map here" in trs[0].metadata["error"]
    assert "refuses it" in trs[1].metadata["error"]
    assert rollout_metrics(trs, 1.0)["rollout/error_rate"] == 1.0


class Summarizes:
    """A policy engine (source "policy") that guesses, and answers a summary request with
    `summary` ids that end in EOS, reported with `finish_reason`."""

    source, max_context, version = "policy", 4096, 0

    def __init__(self, tok, finish_reason):
        self.tok, self.finish_reason, self.k = tok, finish_reason, 0

    async def generate(self, ids, sampling):
        from taurl.policy.protocol import Generation

        if "Summarize" in self.tok.decode(list(ids))[-80:]:  # the request ends the prompt
            out = self.tok("I guess 5", add_special_tokens=False)["input_ids"]
            out, reason = [*out, self.tok.eos_token_id], self.finish_reason
        else:
            self.k += 1
            out = self.tok(f"I guess {self.k}", add_special_tokens=False)["input_ids"]
            reason = "stop"
        return Generation(list(out), [-1.0] * len(out), reason, 0, prompt_tokens=len(ids))


@pytest.mark.parametrize("finish_reason", ["eos", "length"])
def test_a_summary_is_a_turn_of_its_own_and_loses_eos_only_when_it_stopped_there(finish_reason):
    """Every turn has its own index (its position): a summary does not share the next action's.
    The summary's sampled EOS is cut from the message only when the engine stopped on it."""
    texts = ["Guess the number. A number from 1 to 9. Higher: the number is above your guess, "
             "so try a larger one. I guess 5. Summarize the progress so far."] * 30
    tok = build_tokenizer(texts, vocab_size=300)
    from taurl.envs.core import Task

    task = Task(task_id="g0", prompt="A number from 1 to 9.", answers=(), split="train",
                env="guess-v0")
    config = RolloutConfig(max_turns=12, max_action_tokens=8, max_episode_tokens=200,
                           max_context=256, compaction=CompactionConfig(
                               policy="summarize", keep_turns=1, summary_tokens=6))
    tr = validate_trajectory(asyncio.run(run_episode(
        Summarizes(tok, finish_reason), Guess(wins_at=6, role="tool"), tok, task, seed=0,
        config=config)))
    summaries = [t for t in tr.turns if t.action["kind"] == "summary"]
    assert summaries and [t.index for t in tr.turns] == list(range(len(tr.turns)))
    eos = ChatCodec(tok).decode([tok.eos_token_id])
    assert all(t.action_text.endswith(eos) for t in summaries)  # the turn holds what was sampled
    prompt = stream_views(tr)[1].messages[1]["content"]  # the task and the summary
    assert prompt.startswith(task.prompt + "\n")
    assert prompt.endswith(eos) == (finish_reason != "eos")
