"""The Responses and Messages APIs on the proxy: the real `openai` and `anthropic` SDKs, real
HTTP, a real tiny HF model; the same capture, budgets and 429s as Chat Completions.

Scripted replies (`ReplyEngine`) where the test needs a tool call or a reasoning block;
the untrained policy itself where it needs sampled ids and logprobs to check.
"""

from __future__ import annotations

import copy

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("starlette")

from taurl.data.trajectory import StopReason, validate_trajectory  # noqa: E402
from taurl.envs.search import generate_tasks  # noqa: E402
from taurl.envs.search.env import SEARCH_TOOL  # noqa: E402
from taurl.policy.engine import LocalEngine  # noqa: E402
from taurl.policy.model import build_default_policy  # noqa: E402
from taurl.proxy.admission import AdmissionRequest  # noqa: E402
from taurl.proxy.experts import ReplyEngine  # noqa: E402
from taurl.proxy.runner import episode_records  # noqa: E402
from taurl.proxy.server import ProxyLimits, ProxyServer  # noqa: E402
from taurl.rollout.loop import ChatCodec  # noqa: E402
from taurl.tools.parsers import tool_call_text  # noqa: E402

TASK = generate_tasks("train", n=1, seed=0)[0]
CHAT_TOOLS = [copy.deepcopy(SEARCH_TOOL)]
FN = CHAT_TOOLS[0]["function"]
RESP_TOOLS = [
    {
        "type": "function",
        "name": FN["name"],
        "description": FN["description"],
        "parameters": FN["parameters"],
    }
]
ANTH_TOOLS = [
    {"name": FN["name"], "description": FN["description"], "input_schema": FN["parameters"]}
]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    texts = [t.prompt for t in generate_tasks("train", n=200, seed=0)] + [
        tool_call_text("search", {"query": "Lyon"})
    ]
    return build_default_policy(texts, tmp_path_factory.mktemp("p"), size="tiny", seed=0)


def records(proxy, eid, source="policy"):
    ep = proxy.pop(eid)
    trajs = episode_records(
        ep, task=TASK, group_id="g", run_id="t", env_name="search-v0", env_version="1",
        verifier=None, error=None, agent_name="t", answer=None, source=source,
    )
    for t in trajs:
        validate_trajectory(t)
    return trajs


def token_exact(traj, tok, model, tools):
    """The stream renders the record's messages; recomputed logprobs match within 1e-4."""
    codec = ChatCodec(tok, tools)
    assert codec.decode(traj.token_ids) == codec.render(
        list(traj.messages), add_generation_prompt=False
    )
    ids = torch.tensor([traj.token_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(
            -1, ids[0, 1:, None]
        )[:, 0]
    mask = torch.tensor(traj.action_mask[1:], dtype=torch.bool)
    assert (
        mask.any() and float((lp[mask] - torch.tensor(traj.logprobs[1:])[mask]).abs().max()) <= 1e-4
    )


def proxy_for(policy, **kw):
    model, tok = policy
    return ProxyServer(LocalEngine(model, tok, version=2, seed=0), tok,
                       limits=ProxyLimits(**{"max_action_tokens": 10, "max_context": 1024, **kw}),
                       open_on_call=True)


def responses_agent(c, stream=False, chain_by_id=False):
    """Two turns of the Responses API, the history sent back as the Agents SDK sends it (the
    output items as returned, then a user turn), or chained by ``previous_response_id``."""
    items = [{"role": "user", "content": TASK.prompt}]
    prev = None
    for turn in range(2):
        kw = {"previous_response_id": prev, "input": items[-1:]} if prev else {"input": items}
        if stream:
            events = list(
                c.responses.create(
                    model="m", instructions="Be brief.", tools=RESP_TOOLS, stream=True, **kw
                )
            )
            assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
            r = events[-1].response
        else:
            r = c.responses.create(model="m", instructions="Be brief.", tools=RESP_TOOLS, **kw)
        items += [o.model_dump(exclude_none=True) for o in r.output]
        items.append({"role": "user", "content": f"Go on ({turn})."})
        prev = r.id if chain_by_id else None
    return r


@pytest.mark.parametrize("stream, chain_by_id", [(False, False), (True, False), (False, True)])
def test_responses_api_turns_are_one_token_exact_chain(policy, stream, chain_by_id):
    model, tok = policy
    with proxy_for(policy) as p:
        r = responses_agent(
            openai.OpenAI(base_url=p.base_url("e"), api_key="x", max_retries=0), stream, chain_by_id
        )
        assert r.usage.output_tokens >= 1 and r.status in ("completed", "incomplete")
        (traj,) = records(p, "e")
    assert sum(s.kind == "action" for s in traj.segments) == 2 and traj.policy_versions == [2]
    assert traj.messages[0] == {"role": "system", "content": "Be brief."}
    token_exact(traj, tok, model, CHAT_TOOLS)


def test_responses_function_calls_and_reasoning_items_round_trip(policy):
    model, tok = policy
    replies = ["<think>Search first.</think>" + tool_call_text("search", {"query": "Lyon"}),
               "<think>It is France.</think>The answer is <answer>France</answer>"]
    with proxy_for(policy, max_calls=4, max_action_tokens=96) as p:
        p.open("e", engine=ReplyEngine(tok, replies))
        c = openai.OpenAI(base_url=p.base_url("e"), api_key="x", max_retries=0)
        items = [{"role": "user", "content": "Where is Lyon?"}]
        r = c.responses.create(model="m", input=items, tools=RESP_TOOLS)
        assert [o.type for o in r.output] == ["reasoning", "function_call"]
        assert r.output[0].content[0].text == "Search first." and r.output[1].name == "search"
        items += [o.model_dump(exclude_none=True) for o in r.output]
        items.append(
            {
                "type": "function_call_output",
                "call_id": r.output[1].call_id,
                "output": "Lyon is in France.",
            }
        )
        r2 = c.responses.create(model="m", input=items, tools=RESP_TOOLS)
        assert [o.type for o in r2.output] == ["reasoning", "message"]
        assert r2.output_text == "The answer is <answer>France</answer>"
        with pytest.raises(openai.BadRequestError, match="previous_response_id 'resp_nope'"):
            c.responses.create(model="m", input="x", previous_response_id="resp_nope")
        with pytest.raises(openai.BadRequestError, match="tool type 'web_search' is not served"):
            c.responses.create(model="m", input="x", tools=[{"type": "web_search"}])
        (traj,) = records(p, "e", source="expert")
    # the reasoning items sent back rebuilt the sampled text: one chain, the
    # answer as the env reads it
    assert traj.turns[0].action["kind"] == "tool_call" and traj.turns[1].action == {
        "kind": "answer",
        "answer": "France",
    }
    assert (
        "Lyon is in France." in traj.turns[0].observation_text
        and traj.stop_reason is StopReason.ANSWERED
    )


@pytest.mark.parametrize("stream", [False, True])
def test_messages_api_tool_use_round_trips_in_one_chain(policy, stream):
    model, tok = policy
    replies = [tool_call_text("search", {"query": "Lyon"}), "<answer>France</answer>"]
    with proxy_for(policy, max_calls=4, max_action_tokens=96) as p:
        p.open("e", engine=ReplyEngine(tok, replies))
        c = anthropic.Anthropic(base_url=p.anthropic_base_url("e"), api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "Where is Lyon?"}]
        kw = {"model": "m", "max_tokens": 64, "system": "Be brief.", "tools": ANTH_TOOLS}
        for _ in range(2):
            if stream:
                with c.messages.stream(messages=msgs, **kw) as s:
                    m = s.get_final_message()
            else:
                m = c.messages.create(messages=msgs, **kw)
            msgs.append(
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in m.content],
                }
            )
            uses = [b for b in m.content if b.type == "tool_use"]
            msgs.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": u.id,
                            "content": "Lyon is in France.",
                        }
                        for u in uses
                    ]
                    or "ok",
                }
            )
        assert m.stop_reason == "end_turn" and m.content[0].text == "<answer>France</answer>"
        (traj,) = records(p, "e", source="expert")
    assert [t.action["kind"] for t in traj.turns] == ["tool_call", "answer"]
    assert traj.turns[0].action["calls"] == [{"name": "search", "arguments": '{"query": "Lyon"}'}]
    assert (
        traj.messages[0]["content"] == "Be brief."
        and "Lyon is in France." in traj.turns[0].observation_text
    )


def test_messages_api_samples_are_token_exact(policy):
    model, tok = policy
    with proxy_for(policy) as p:
        c = anthropic.Anthropic(base_url=p.anthropic_base_url("e"), api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": TASK.prompt}]
        for turn in range(2):
            m = c.messages.create(model="m", max_tokens=64, messages=msgs, tools=ANTH_TOOLS)
            msgs += [
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in m.content],
                },
                {"role": "user", "content": [{"type": "text", "text": f"Go on ({turn})."}]},
            ]
        (traj,) = records(p, "e")
    assert sum(s.kind == "action" for s in traj.segments) == 2
    token_exact(traj, tok, model, CHAT_TOOLS)


class RefuseOnce:
    def __init__(self):
        self.asked = []

    def __call__(self, req: AdmissionRequest):
        self.asked.append(req.kind)
        return 0.2 if len(self.asked) == 1 else None


def test_both_apis_get_429_back_pressure_and_budgets_in_their_own_error_shape(policy):
    model, tok = policy
    with proxy_for(policy, max_calls=1) as p:
        p.admission = RefuseOnce()  # the SDKs retry the 429 after Retry-After
        r = openai.OpenAI(base_url=p.base_url("a"), api_key="x", max_retries=2).responses.create(
            model="m", input="hi"
        )
        assert r.status in ("completed", "incomplete") and p.throttled == 1
        with pytest.raises(openai.BadRequestError, match=r"used its 1 model calls"):
            openai.OpenAI(base_url=p.base_url("a"), api_key="x", max_retries=0).responses.create(
                model="m", input="x"
            )
        p.admission = RefuseOnce()
        c = anthropic.Anthropic(base_url=p.anthropic_base_url("b"), api_key="x", max_retries=2)
        c.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert p.throttled == 2
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "again"}]
            )
        assert (
            e.value.body["error"]["type"] == "invalid_request_error"
            and "model calls" in e.value.message
        )
        assert records(p, "b")[-1].stop_reason is StopReason.MAX_TURNS


def test_a_cut_is_incomplete_only_at_the_agents_own_limit(policy):
    """The proxy's action budget cuts an action and the episode goes on (status completed: the
    Agents SDK raises on incomplete); the agent's own max_output_tokens is the API's incomplete."""
    with proxy_for(policy, max_action_tokens=4) as p:
        c = openai.OpenAI(base_url=p.base_url("e"), api_key="x", max_retries=0)
        own = c.responses.create(model="m", input="hi", max_output_tokens=3)
        budget = c.responses.create(model="m", input="hi again")
        trajs = records(p, "e")
    assert own.status == "incomplete" and own.incomplete_details.reason == "max_output_tokens"
    assert own.usage.output_tokens == 3
    assert budget.status == "completed" and budget.usage.output_tokens == 4
    assert trajs[-1].turns[-1].finish_reason == "length"


def test_an_unknown_route_names_the_routes_served(policy):
    with proxy_for(policy) as p:
        r = httpx.post(f"{p.url}/rollouts/e/v1/embeddings", json={})
        assert r.status_code == 404
        msg = r.json()["error"]["message"]
        for route in ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/mcp"):
            assert route in msg, msg
        assert httpx.get(f"{p.url}/rollouts/e/v1/responses").status_code == 405


def test_responses_input_items_map_to_chat_messages_and_odd_ones_are_refused_by_name():
    from taurl.proxy.capture import ProxyError
    from taurl.proxy.responses import input_messages

    items = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Be brief."}],
        },
        {"role": "user", "content": "q"},
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "s"}],
            "encrypted_content": "x",
        },
        {
            "type": "reasoning",
            "content": [{"type": "reasoning_text", "text": "plan"}],
            "summary": [],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Looking."}],
        },
        {"type": "function_call", "call_id": "c1", "name": "search", "arguments": '{"query": "q"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
    ]
    assert input_messages(items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "<think>plan</think>Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"query": "q"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    for bad, says in (
        ({"type": "item_reference", "id": "x"}, "input item type 'item_reference'"),
        ({"role": "user", "content": [{"type": "input_image"}]}, "content part 'input_image'"),
    ):
        with pytest.raises(ProxyError, match=says):
            input_messages([bad])


def test_a_command_agent_on_the_anthropic_sdk_finds_the_proxy_by_its_environment(policy):
    """`command:` agents get ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY (the SDK's own variables)."""
    import asyncio
    import sys
    from pathlib import Path

    from taurl.proxy.runner import AgentConfig, run_agent_episode
    from taurl.rollout.episodes import EpisodeSpec

    model, tok = policy
    example = Path(__file__).resolve().parents[1] / "examples" / "anthropic_agent.py"
    agent = AgentConfig(
        command=(sys.executable, str(example)), timeout_s=60, name="anthropic_agent"
    )
    with proxy_for(policy, max_action_tokens=32) as p:
        (traj,) = asyncio.run(
            run_agent_episode(
                p, agent, None, EpisodeSpec("e", TASK, 0, "g"), run_id="t", env_name="search-v0",
                env_version="1", verifier=None,
                engine=ReplyEngine(tok, ["<answer>France</answer>"]), source="expert",
            )
        )
    assert (
        traj.metadata["agent_answer"] == "<answer>France</answer>"
        and traj.metadata["error"] is None
    )
    assert traj.turns[0].action == {"kind": "answer", "answer": "France"}
