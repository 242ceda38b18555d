"""A call the proxy refuses for a budget ends the episode the way the env's budgets would
(issue 28): ``agent.max_calls`` spent → ``max_turns``, a conversation longer than the context
→ ``context_full``; a valid truncation whatever the agent does after the 400 (its SDK
raises). An episode without any sampled call leaves no record, with the refusal as its cause,
and a round of only those stops the run — `taurl train` exits non-zero with that cause.

The agent is the repository's example (`examples/openai_agent.py`, the official `openai`
SDK, unchanged); the model's replies are scripted, as a policy's: what is under test is the
proxy's record, not the policy.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from taurl import envs  # noqa: E402
from taurl.data.ledger import Ledger  # noqa: E402
from taurl.data.trajectory import StopReason, validate_trajectory  # noqa: E402
from taurl.envs.search import generate_tasks  # noqa: E402
from taurl.envs.search.expert import search_tool_expert  # noqa: E402
from taurl.policy.protocol import Generation  # noqa: E402
from taurl.proxy.collect import collect_agent  # noqa: E402
from taurl.proxy.experts import ReplyEngine  # noqa: E402
from taurl.rollout.episodes import EpisodeSpec  # noqa: E402
from taurl.rollout.loop import ChatCodec, RolloutConfig  # noqa: E402
from taurl.rollout.runner import EpisodeError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AGENT = {"callable": str(ROOT / "examples/openai_agent.py") + ":run_agent", "timeout_s": 30}
TASKS = generate_tasks("train", n=2, seed=5)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from taurl.envs.search import build_corpus
    from taurl.policy.model import build_default_policy

    texts = [d.text for d in build_corpus()[::40]] + [
        t.prompt for t in generate_tasks("train", n=300, seed=0)
    ]
    return build_default_policy(texts, tmp_path_factory.mktemp("p"), size="tiny", seed=0)[1]


class ScriptedPolicy(ReplyEngine):
    """The expert's replies, served as a policy's samples (logprobs and a version)."""

    def __init__(self, tokenizer, replies):
        super().__init__(tokenizer, replies)
        self.source = "policy"

    async def generate(self, prompt_ids, sampling):
        g = await super().generate(prompt_ids, sampling)
        return Generation(g.token_ids, [-0.5] * len(g.token_ids), g.finish_reason, 0)


def collect(tok, tmp_path, *, max_calls=4, max_context=1024, specs=None):
    specs = specs or [EpisodeSpec(f"ep{i}", t, i, f"g{i}") for i, t in enumerate(TASKS)]
    agent = {**AGENT, "max_calls": max_calls}
    tmp_path.mkdir(parents=True, exist_ok=True)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        return asyncio.run(
            collect_agent(
                None,
                tok,
                lambda: envs.make("search-v0", top_k=1, max_doc_chars=80),
                specs,
                agent=agent,
                config=RolloutConfig(max_action_tokens=64, max_context=max_context),
                ledger=ledger,
                run_id="t",
                engine_for=lambda s: ScriptedPolicy(
                    tok, search_tool_expert(s.task, random.Random(0), p_skip_search=0.0)
                ),
            )
        )


def test_a_spent_call_budget_is_a_max_turns_truncation_not_an_agent_error(tok, tmp_path):
    # the search call is answered, the next one refused
    trajs, stats = collect(tok, tmp_path, max_calls=1)
    assert len(trajs) == 2 and stats["rollout/agent_errors"] == 0
    for t in trajs:
        validate_trajectory(t)
        assert t.stop_reason is StopReason.MAX_TURNS and t.truncated and t.valid, t.metadata
        assert len(t.turns) == 1 and t.turns[0].action["kind"] == "tool_call"
        assert t.metadata["error"] is None and "BadRequestError" in t.metadata["agent_error"]
        assert "model calls" in t.metadata["proxy_refusal"]
        # scored by the verifier: no answer was given
        assert t.reward_components == {"outcome": 0.0}


def test_a_context_refusal_is_a_context_full_truncation_that_ends_at_the_last_action(tok, tmp_path):
    full, _ = collect(tok, tmp_path / "full")  # the unrefused episodes: search, then answer
    assert all(len(t.turns) == 2 for t in full)
    # room for the first call and its action, not for the search result that follows it
    limit = (
        max(
            len(t.segments[0].token_ids) + len(t.segments[t.turns[0].action_segment].token_ids)
            for t in full
        )
        + 4
    )
    trajs, stats = collect(tok, tmp_path / "cut", max_context=limit)
    assert len(trajs) == 2 and stats["rollout/agent_errors"] == 0
    for t in trajs:
        validate_trajectory(t)
        assert t.stop_reason is StopReason.CONTEXT_FULL and t.truncated and t.valid
        assert "context limit" in t.metadata["proxy_refusal"] and len(t.turns) == 1
        # the refused call left nothing behind: the stream is the first call and its action, closed
        codec = ChatCodec(tok, None)
        assert t.segments[-1].kind in ("action", "template") and "observation" not in [
            s.kind for s in t.segments
        ]
        assert codec.decode(t.token_ids).startswith(codec.decode(t.segments[0].token_ids))


def test_an_agent_whose_every_call_is_refused_stops_the_round_with_that_cause(tok, tmp_path):
    with pytest.raises(EpisodeError) as e:
        collect(tok, tmp_path, max_context=16)
    text = str(e.value)
    assert "every model call was refused" in text and "the context limit is 16" in text, text
    assert "made no model call" not in text


LONG_PROMPT_AGENT = '''
from openai import OpenAI


def run_agent(task, base_url, retriever_url):
    """An agent framework's way: a system prompt longer than the policy's context."""
    system = "You are a careful agent. " * 400
    client = OpenAI(base_url=base_url, api_key="x", max_retries=0)
    reply = client.chat.completions.create(model="m",
                                           messages=[{"role": "system", "content": system},
                                                     {"role": "user", "content": task}])
    return reply.choices[0].message.content
'''


def test_taurl_train_exits_non_zero_with_the_refusal_when_no_episode_left_a_record(
    tmp_path, monkeypatch, capsys
):
    import yaml

    from taurl.cli.main import main

    (tmp_path / "long_prompt_agent.py").write_text(LONG_PROMPT_AGENT)
    monkeypatch.chdir(tmp_path)
    cfg = {
        "env": "search-v0",
        "system_prompt": "",
        "task_options": {"families": ["city_country"], "split_by": "city"},
        "agent": {"callable": "long_prompt_agent.py:run_agent", "timeout_s": 30},
        "sft": "none",
        # the policy's copy warm-up (300 steps) is not under test
        "warmup_options": {"steps": 0},
        "tokenizer_texts": 2000,
        "max_context": 1024,
        "updates": 1,
        "tasks_per_update": 2,
        "group_size": 2,
        "eval_tasks": 2,
        "eval_trials": 1,
        "concurrency": 4,
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    code = main(
        [
            "train", "--config", str(tmp_path / "cfg.yaml"), "--run-dir", str(tmp_path / "run"),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code != 0, err
    assert "every model call was refused" in err and "the context limit is 1024" in err, err
