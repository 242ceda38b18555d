"""The training proxy: real HTTP (uvicorn), the real `openai` SDK, a real tiny HF model.

The policy is the default tiny Qwen2 built from scratch (untrained: its samples are
arbitrary text, which is what the capture must survive); LocalEngine serves it behind
`ProxyServer`. Each test drives the proxy with an agent written against the SDK.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from taurl import envs  # noqa: E402
from taurl.data.chains import stream_views  # noqa: E402
from taurl.data.ledger import Ledger  # noqa: E402
from taurl.data.trajectory import StopReason, validate_trajectory  # noqa: E402
from taurl.envs.search import generate_tasks  # noqa: E402
from taurl.envs.search.env import SEARCH_TOOL  # noqa: E402
from taurl.envs.search.expert import search_tool_expert  # noqa: E402
from taurl.policy.engine import LocalEngine  # noqa: E402
from taurl.policy.model import build_default_policy  # noqa: E402
from taurl.proxy.collect import collect_agent  # noqa: E402
from taurl.proxy.experts import ReplyEngine  # noqa: E402
from taurl.proxy.runner import episode_records  # noqa: E402
from taurl.proxy.server import ProxyLimits, ProxyServer  # noqa: E402
from taurl.rollout.episodes import EpisodeSpec  # noqa: E402
from taurl.rollout.loop import ChatCodec, RolloutConfig  # noqa: E402
from taurl.tools.parsers import tool_call_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# the env class's declaration, not envs.make: building the env at import would build the
# BM25 index before conftest points TAURL_CACHE at the test cache
TOOLS = [copy.deepcopy(SEARCH_TOOL)]
TASK = generate_tasks("train", n=1, seed=0)[0]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from taurl.envs.search import build_corpus

    texts = [d.text for d in build_corpus()[::40]] + [
        t.prompt for t in generate_tasks("train", n=300, seed=0)
    ]
    model, tok = build_default_policy(texts, tmp_path_factory.mktemp("p"), size="tiny", seed=0)
    return model, tok


@pytest.fixture()
def proxy(policy):
    model, tok = policy
    engine = LocalEngine(model, tok, version=3, seed=0)
    limits = ProxyLimits(max_calls=8, max_action_tokens=12, max_context=1024)
    with ProxyServer(engine, tok, limits=limits, open_on_call=True) as p:  # ids as `taurl proxy`'s
        yield p


def client(proxy, eid):
    return openai.OpenAI(base_url=proxy.base_url(eid), api_key="x", max_retries=0)


def records(proxy, eid, error=None):
    ep = proxy.pop(eid)
    return episode_records(
        ep, task=TASK, group_id="g", run_id="t", env_name="search-v0", env_version="1",
        verifier=envs.spec("search-v0").make_verifier(), error=error, agent_name="test",
        answer=None,
    )


def append_only_agent(c, stream=False, turns=3, tools=True):
    """Appends every reply as returned, then a tool result (tool calls) or a user turn."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": TASK.prompt},
    ]
    for t in range(turns):
        kw = {"tools": TOOLS} if tools else {}
        if stream:
            content, calls = "", {}
            for ch in c.chat.completions.create(model="m", messages=messages, stream=True, **kw):
                d = ch.choices[0].delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    e = calls.setdefault(tc.index, {"id": tc.id, "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
                    e["function"]["name"] += (tc.function.name or "")
                    e["function"]["arguments"] += (tc.function.arguments or "")
            reply = {"role": "assistant", "content": content or None}
            if calls:
                reply["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            reply = c.chat.completions.create(model="m", messages=messages, **kw).choices[0].message
            reply = reply.model_dump(exclude_none=True)
        messages.append(reply)
        for tc in reply.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": f"result {t}"})
        if not reply.get("tool_calls"):
            messages.append({"role": "user", "content": f"Go on ({t})."})
    return messages


def check_invariants(traj, tok, engine_model, temperature=1.0, tools=TOOLS):
    validate_trajectory(traj)
    codec = ChatCodec(tok, tools)
    # decode(ids) equals the chat rendering of the record's messages
    assert codec.decode(traj.token_ids) == codec.render(
        list(traj.messages), add_generation_prompt=False
    )
    # recomputed logprobs of the action ids reproduce the behaviour logprobs
    ids = torch.tensor([traj.token_ids])
    with torch.no_grad():
        logits = engine_model(input_ids=ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits / temperature, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    mask = torch.tensor(traj.action_mask[1:], dtype=torch.bool)
    assert mask.any()
    assert float((lp[mask] - torch.tensor(traj.logprobs[1:])[mask]).abs().max()) <= 1e-4


class Recorder:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    version = property(lambda self: self.inner.version)
    max_context = property(lambda self: self.inner.max_context)

    async def generate(self, ids, sampling):
        g = await self.inner.generate(ids, sampling)
        self.calls.append((list(ids), g))
        return g


def test_append_only_agent_gives_one_token_exact_chain(policy):
    model, tok = policy
    engine = Recorder(LocalEngine(model, tok, version=3, seed=0))
    with ProxyServer(engine, tok, limits=ProxyLimits(max_action_tokens=12, max_context=1024)) as p:
        p.open("ep1", seed=5)
        append_only_agent(client(p, "ep1"), turns=3)
        (traj,) = records(p, "ep1")
    check_invariants(traj, tok, model)
    assert len(engine.calls) == 3 and traj.policy_versions == [3]
    # mask 1 exactly on the engine's sampled ids, in order, each call's prompt the stream so far
    actions = [s for s in traj.segments if s.kind == "action"]
    for (prompt, gen), seg in zip(engine.calls, actions, strict=True):
        assert list(seg.token_ids) == gen.token_ids and list(seg.logprobs) == gen.logprobs
        assert traj.token_ids[:len(prompt)] == prompt
    assert [s.kind for s in traj.segments] == [
        "prompt", "action", "observation", "action", "observation", "action",
    ] + (["template"] if traj.segments[-1].kind == "template" else [])


def test_tool_calls_round_trip_through_the_sdk_and_stay_token_exact(policy):
    model, tok = policy
    replies = [tool_call_text("search", {"query": "Lyon"}), "<answer> France</answer>"]
    with ProxyServer(LocalEngine(model, tok), tok, limits=ProxyLimits(max_action_tokens=64)) as p:
        p.open("ep", engine=ReplyEngine(tok, replies))
        c = client(p, "ep")
        r = c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "q"}], tools=TOOLS
        )
        assert r.choices[0].finish_reason == "tool_calls"
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == "search" and json.loads(call.function.arguments) == {
            "query": "Lyon"
        }
        msgs = [
            {"role": "user", "content": "q"},
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "Doc 1 Lyon is in France"},
        ]
        r2 = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        assert (
            r2.choices[0].message.content == "<answer> France</answer>"
            and not r2.choices[0].message.tool_calls
        )
        ep = p.pop("ep")
    (traj,) = episode_records(
        ep, task=TASK, group_id="g", run_id="t", env_name="search-v0", env_version="1",
        verifier=None, error=None, agent_name="t", answer=None, source="expert",
    )
    validate_trajectory(traj)
    codec = ChatCodec(tok, TOOLS)
    assert codec.decode(traj.token_ids) == codec.render(
        list(traj.messages), add_generation_prompt=False
    )
    assert traj.turns[0].action["kind"] == "tool_call" and traj.turns[-1].action == {
        "kind": "answer",
        "answer": "France",
    }
    assert (
        traj.stop_reason == StopReason.ANSWERED
        and "Lyon is in France" in traj.turns[0].observation_text
    )


def test_malformed_tool_call_comes_back_as_content_and_is_counted(policy):
    model, tok = policy
    bad = '<tool_call>\n{"name": "search", "arguments": {"query": </tool_call>'
    with ProxyServer(LocalEngine(model, tok), tok, limits=ProxyLimits(max_action_tokens=64)) as p:
        p.open("ep", engine=ReplyEngine(tok, [bad]))
        r = client(p, "ep").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "q"}], tools=TOOLS
        )
        assert r.choices[0].message.content == bad and not r.choices[0].message.tool_calls
        assert p.episodes["ep"].capture.malformed_calls == 1
        (traj,) = records(p, "ep")
    assert traj.turns[0].invalid and traj.metadata["malformed_calls"] == 1


def test_streaming_and_non_streaming_give_the_same_record(policy):
    model, tok = policy
    out = []
    for stream in (False, True):
        with ProxyServer(LocalEngine(model, tok, version=1, seed=0), tok,
                         limits=ProxyLimits(max_action_tokens=12, max_context=1024)) as p:
            p.open("ep", seed=9)
            append_only_agent(client(p, "ep"), stream=stream, turns=2)
            out.append(records(p, "ep"))
    (a,), (b,) = out
    assert a.segments == b.segments and a.messages == b.messages
    assert [t.action for t in a.turns] == [t.action for t in b.turns]


def test_history_rewriting_agent_gets_new_chains_and_no_retokenized_action(policy):
    model, tok = policy
    engine = Recorder(LocalEngine(model, tok, version=2, seed=0))
    with ProxyServer(engine, tok, limits=ProxyLimits(max_action_tokens=12, max_context=1024)) as p:
        p.open("ep", seed=1)
        c = client(p, "ep")
        msgs = [{"role": "user", "content": "first"}]
        r = c.chat.completions.create(model="m", messages=msgs).choices[0].message
        msgs += [r.model_dump(exclude_none=True), {"role": "user", "content": "second"}]
        c.chat.completions.create(model="m", messages=msgs)  # append-only: same chain
        edited = [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "I said something else."},
            {"role": "user", "content": "third"},
        ]
        # an edited assistant turn: a new chain
        c.chat.completions.create(model="m", messages=edited)
        # a new conversation
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "fresh"}])
        (episode,) = records(p, "ep")  # one episode: its chains are its token streams
    assert episode.episode_id == "ep" and episode.metadata["chains"] == 3
    assert [s.reason for s in episode.stream_starts] == ["assistant_edited", "history_edited"]
    trajs = stream_views(episode)
    assert len(trajs) == 3 and [len(t.turns) for t in trajs] == [2, 1, 1]
    from taurl.train.chains import split_streams

    # the episode's credit reaches every chain
    rows, adv = split_streams([episode], np.full((1, 4), 0.5))
    assert len(rows) == 3 and all((adv[j, :len(r.turns)] == 0.5).all() for j, r in enumerate(rows))
    sampled = [g.token_ids for _, g in engine.calls]
    for t in trajs:
        check_invariants(t, tok, model, tools=None)
        # every mask-1 run is exactly one sampled completion, never re-encoded text
        for s in t.segments:
            if s.kind == "action":
                assert list(s.token_ids) in sampled
    # the edited chain's prompt re-renders history with mask 0 only
    assert (
        trajs[1].segments[0].kind == "prompt"
        and sum(s.kind == "action" for s in trajs[1].segments) == 1
    )


def test_completions_endpoint_extends_its_text_chain(policy):
    model, tok = policy
    with ProxyServer(
        LocalEngine(model, tok, version=0, seed=0), tok, limits=ProxyLimits(max_action_tokens=8)
    ) as p:
        p.open("ep")
        c = client(p, "ep")
        t1 = c.completions.create(model="m", prompt="Lyon is in").choices[0].text
        c.completions.create(model="m", prompt="Lyon is in" + t1 + " and Paris")
        ep = p.pop("ep")
    (chain,) = ep.capture.chains
    assert [s.kind for s in chain.segments] == ["prompt", "action", "observation", "action"]
    assert chain.codec.decode(chain.ids).startswith("Lyon is in" + t1 + " and Paris")


def test_calls_after_the_end_and_unknown_rewards_are_refused(proxy):
    import httpx

    proxy.open("ep")
    r = httpx.post(f"{proxy.url}/rollouts/ep/reward", json={"reward": "high"})
    assert r.status_code == 400
    assert httpx.post(f"{proxy.url}/rollouts/ep/reward", json={"reward": 0.5}).status_code == 200
    assert proxy.episodes["ep"].reward == 0.5
    assert httpx.post(f"{proxy.url}/rollouts/ep/end").status_code == 200
    with pytest.raises(openai.APIStatusError) as e:
        client(proxy, "ep").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert e.value.status_code == 409


def test_call_budget_truncates_the_episode(policy):
    model, tok = policy
    with ProxyServer(
        LocalEngine(model, tok), tok, limits=ProxyLimits(max_calls=2, max_action_tokens=8)
    ) as p:
        p.open("ep")
        with pytest.raises(openai.BadRequestError):
            append_only_agent(client(p, "ep"), turns=3, tools=False)
        (traj,) = records(p, "ep")
    assert traj.stop_reason == StopReason.MAX_TURNS and len(traj.turns) == 2


# ---------------------------------------------------------------------------------------
# The runner: agents that crash or hang cost one counted episode


CRASHER = """
import os, sys
from openai import OpenAI
c = OpenAI(max_retries=0)
c.chat.completions.create(model="m",
                          messages=[{"role": "user", "content": os.environ["TAURL_TASK"]}])
if "CRASH" in os.environ["TAURL_EPISODE_ID"]:
    sys.exit(3)
if "HANG" in os.environ["TAURL_EPISODE_ID"]:
    open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
    import time; time.sleep(600)
print("France")
"""


def test_crashing_and_hanging_agents_cost_one_counted_episode_each(policy, tmp_path, monkeypatch):
    model, tok = policy
    script = tmp_path / "agent.py"
    script.write_text(CRASHER)
    pid_file = tmp_path / "hang.pid"
    monkeypatch.setenv("PID_FILE", str(pid_file))
    tasks = generate_tasks("train", n=3, seed=4)
    specs = [
        EpisodeSpec(eid, t, i, f"g{i}")
        for i, (eid, t) in enumerate(zip(["okA", "CRASH", "HANG"], tasks, strict=True))
    ]
    engine = LocalEngine(model, tok, version=0, seed=0)
    t0 = time.perf_counter()
    with Ledger(tmp_path / "l.sqlite") as ledger:
        trajs, stats = asyncio.run(
            collect_agent(
                engine, tok, lambda: envs.make("search-v0"), specs,
                agent={"command": [sys.executable, str(script)], "timeout_s": 20},
                config=RolloutConfig(max_action_tokens=8), ledger=ledger, run_id="t",
            )
        )
        assert len(ledger) == 3
    assert time.perf_counter() - t0 < 60
    by = {t.episode_id: t for t in trajs}
    assert by["okA"].stop_reason == StopReason.ANSWERED and by["okA"].valid
    assert by["okA"].metadata["agent_answer"] == "France"
    for eid, why in (("CRASH", "exit status 3"), ("HANG", "timed out")):
        assert (
            by[eid].stop_reason == StopReason.ERROR
            and not by[eid].valid
            and why in by[eid].metadata["error"]
        )
    assert stats["rollout/agent_errors"] == 2 and stats["rollout/failed_episodes"] == 0
    with pytest.raises(ProcessLookupError):  # the hung agent was killed, not left behind
        os.kill(int(pid_file.read_text()), 0)


def test_example_agent_runs_expert_demonstrations_through_the_proxy(policy, tmp_path):
    """The example agent, unchanged, with the expert's replies: the SFT data of the recipe."""
    model, tok = policy
    tasks = generate_tasks("train", n=4, seed=2)
    specs = [EpisodeSpec(f"demo-{i}", t, i, f"demo:{t.task_id}") for i, t in enumerate(tasks)]
    import random

    with Ledger(tmp_path / "l.sqlite") as ledger:
        trajs, stats = asyncio.run(
            collect_agent(
                LocalEngine(model, tok),
                tok,
                lambda: envs.make("search-v0", top_k=1, max_doc_chars=80),
                specs,
                agent={"callable": str(ROOT / "examples/openai_agent.py") + ":run_agent"},
                config=RolloutConfig(max_action_tokens=64),
                ledger=ledger,
                run_id="t",
                source="expert",
                engine_for=lambda s: ReplyEngine(tok, search_tool_expert(s.task, random.Random(0))),
            )
        )
    assert len(trajs) == 4 and all(t.source == "expert" and t.reward == 1.0 for t in trajs)
    assert all(t.num_tool_calls >= 1 for t in trajs)  # the retriever service's receipts
    assert "<tool_response>" in ChatCodec(tok).decode(trajs[0].token_ids)


def test_agent_config_errors_are_reported_together_before_any_work():
    from taurl.errors import ConfigError
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.validate import load_config

    with pytest.raises(ConfigError) as e:
        load_config(
            TrainConfig,
            {"agent": {"callable": "no_colon", "command": ["x"], "timeout_s": 0, "bogus": 1}},
        )
    text = str(e.value)
    for part in (
        "unknown key(s) ['bogus']", "exactly one of 'callable'",
        'must be "path/to/file.py:function"', "timeout_s must be a number > 0",
    ):
        assert part in text
    cfg = load_config(TrainConfig, path=ROOT / "configs/openai_agent.yaml")
    assert cfg.agent["callable"] == "examples/openai_agent.py:run_agent"


def test_example_agent_imports_nothing_from_taurl():
    src = (ROOT / "examples/openai_agent.py").read_text()
    assert "taurl" not in "".join(
        ln for ln in src.splitlines() if ln.startswith(("import", "from"))
    )
    assert len(src.splitlines()) <= 70
