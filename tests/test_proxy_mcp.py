"""The proxy agent calling MCP tools through taurl's host gate (`taurl.proxy.tools`).

A real MCP stdio server (`taurl.envs.mcp.server`, written with the SDK; its ``--log``
records every call it receives), real HTTP (uvicorn), and an agent written against the
official `openai` SDK that lists its tools from ``tools_url`` and sends each tool call the
model makes to ``{tools_url}/call``. The model's replies are scripted (`ReplyEngine`, the
proxy's demonstration engine): what is under test is the gate, the receipts and the
record, not the policy.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("mcp")

from taurl import envs  # noqa: E402
from taurl.data.trajectory import StopReason, validate_trajectory  # noqa: E402
from taurl.envs import make_tasks  # noqa: E402
from taurl.errors import ConfigError  # noqa: E402
from taurl.policy import build_tokenizer  # noqa: E402
from taurl.proxy.experts import ReplyEngine  # noqa: E402
from taurl.proxy.runner import AgentConfig, agent_problems, run_agent_episode  # noqa: E402
from taurl.proxy.server import ProxyLimits, ProxyServer  # noqa: E402
from taurl.proxy.tools import ProxyTools  # noqa: E402
from taurl.rollout.episodes import EpisodeSpec  # noqa: E402
from taurl.tools.parsers import tool_call_text  # noqa: E402

SERVER = [sys.executable, "-m", "taurl.envs.mcp.server"]
TASK = make_tasks("mcp-v0", "train", n=1, seed=3)[0]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def mcp_agent(task: str, base_url: str, retriever_url: str, tools_url: str) -> str:
    """A user's agent: the openai SDK for the model, taurl's tools endpoint for the tools."""
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    with urllib.request.urlopen(tools_url, timeout=30) as r:
        tools = json.load(r)["tools"]
    messages = [{"role": "user", "content": task}]
    for _ in range(6):
        reply = (
            client.chat.completions.create(model="m", messages=messages, tools=tools)
            .choices[0]
            .message
        )
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return reply.content or ""
        for call in reply.tool_calls:
            messages.append(_post(f"{tools_url}/call", call.model_dump())["message"])
    return ""


@pytest.fixture(scope="module")
def tok():
    texts = [t.prompt for t in make_tasks("mcp-v0", "train", n=12)] + [
        tool_call_text("table__lookup", {"item": "x"})
    ]
    return build_tokenizer(texts * 4, vocab_size=600, model_max_length=8192)


def received(log) -> list[dict]:
    return [json.loads(line) for line in open(log)] if os.path.exists(log) else []


def play(tok, tools: ProxyTools, replies: list[str], eid: str = "e0"):
    """One episode of `mcp_agent` through the proxy; its records (one chain: the last is all)."""
    agent = AgentConfig(callable="test:mcp_agent", timeout_s=60, max_calls=6, name="mcp_agent")
    spec = EpisodeSpec(eid, TASK, 0, "g")
    limits = ProxyLimits(max_calls=6, max_action_tokens=96, max_context=4096)
    with ProxyServer(None, tok, limits=limits, tools=tools) as proxy:
        trajs = asyncio.run(run_agent_episode(
            proxy, agent, mcp_agent, spec, run_id="t", env_name="mcp-v0", env_version="1",
            verifier=envs.spec("search-v0").make_verifier(), engine=ReplyEngine(tok, replies, 4096),
            source="expert"))
    for t in trajs:
        validate_trajectory(t)
    return trajs[-1]


def lookup(item: str) -> str:
    return tool_call_text("table__lookup", {"item": item})


def test_the_gate_allows_a_granted_tool_and_refuses_a_forbidden_one_with_a_receipt(tok, tmp_path):
    log = tmp_path / "calls.jsonl"
    tools = ProxyTools.from_config(
        {
            "mcp_servers": [
                {"name": "table", "command": [*SERVER, "--log", str(log)], "stderr": f"{log}.err"}
            ],
            "scopes": ["read"],
        }
    )
    assert sorted(d["function"]["name"] for d in tools.declarations) == [
        "table__lookup",
        "table__write_note",
    ]
    item = TASK.metadata["item"]
    note = tool_call_text("table__write_note", {"item": item, "note": "mine"})
    traj = play(tok, tools, [lookup(item), note, f"<answer>{TASK.answers[0]}</answer>"])
    first, second = traj.turns[0].receipt, traj.turns[1].receipt
    assert (first.tool, first.decision, first.status) == ("table__lookup", "allowed", "ok")
    # the server's answer reached the model
    assert TASK.answers[0] in traj.turns[0].observation_text
    # write_note needs the write scope, which is not granted: refused, and it
    # never reached the server
    assert (second.tool, second.decision, second.status) == (
        "table__write_note",
        "denied",
        "denied",
    )
    assert second.reason.startswith("scope:")
    assert [c["tool"] for c in received(log)] == ["lookup"]
    # a forbidden tool truncates the episode with the gate's penalty, as in the built-in loop;
    # the agent's next model call is refused (409) and that is no error of the record
    assert traj.stop_reason is StopReason.TOOL_BUDGET and traj.truncated and traj.valid
    assert traj.reward_components == {"outcome": 0.0, "constraint": -1.0} and traj.reward == -1.0
    assert "409" in traj.metadata["agent_error"] and traj.metadata["gate_stop"].startswith("scope:")
    assert len(traj.turns) == 2


def test_an_allow_list_refusal_and_a_schema_error_from_the_agent(tok, tmp_path):
    log = tmp_path / "calls.jsonl"
    tools = ProxyTools.from_config(
        {
            "mcp_servers": [
                {"name": "table", "command": [*SERVER, "--log", str(log)], "stderr": f"{log}.err"}
            ],
            "allow": ["table__lookup"],
            "scopes": ["read", "write"],
        }
    )
    item = TASK.metadata["item"]
    bad = tool_call_text("table__lookup", {"name": item})  # the schema wants "item"
    note = tool_call_text("table__write_note", {"item": item, "note": "mine"})
    traj = play(tok, tools, [bad, lookup(item), note])
    rs = [t.receipt for t in traj.turns]
    assert [(r.decision, r.reason.split(":")[0]) for r in rs] == [
        ("denied", "schema"),
        ("allowed", ""),
        ("denied", "not_allowed"),
    ]
    assert [c["tool"] for c in received(log)] == ["lookup"]
    assert traj.stop_reason is StopReason.TOOL_BUDGET and traj.reward == -1.0


def test_a_server_crash_mid_episode_is_one_counted_tool_error(tok, tmp_path):
    log = tmp_path / "calls.jsonl"
    server = {
        "name": "table",
        "command": [*SERVER, "--log", str(log), "--crash-after", "2"],
        "max_restarts": 1,
        "stderr": f"{log}.err",
    }
    tools = ProxyTools.from_config({"mcp_servers": [server]})
    item = TASK.metadata["item"]
    traj = play(
        tok,
        tools,
        [lookup(item), lookup(item), lookup(item), f"<answer>{TASK.answers[0]}</answer>"],
    )
    statuses = [t.receipt.status if t.receipt else None for t in traj.turns]
    # the crash costs one call; a restarted server serves the next
    assert statuses == ["ok", "error", "ok", None]
    assert traj.num_errors == 1 and "failed during the call" in traj.turns[1].error
    assert (
        traj.stop_reason is StopReason.ANSWERED and traj.valid and traj.reward == pytest.approx(1.0)
    )
    assert len({c["pid"] for c in received(log)}) == 2


def test_the_tools_config_is_checked_and_a_proxy_without_tools_has_no_endpoint(tok):
    assert agent_problems({"callable": "a.py:f", "tools": {"mcp_servers": [], "bogus": 1}}) == [
        "agent.tools: unknown key(s) ['bogus']; known: ['mcp_servers', 'allow', 'scopes', "
        "'max_calls', 'max_wall_s', 'max_cost']",
        "agent.tools.mcp_servers must be a non-empty list of servers (name, and command or url)",
    ]
    with pytest.raises(ConfigError):
        ProxyTools.from_config({"mcp_servers": "table"})
    # without tools the proxy has no tools endpoint (404), and the agent is not given a URL
    with ProxyServer(None, tok) as proxy:
        proxy.open("x")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{proxy.url}/rollouts/x/tools", timeout=10)
        assert e.value.code == 404


def test_a_command_agent_gets_the_tools_url_in_its_environment(tok):
    from taurl.proxy.runner import run_agent
    from taurl.tools.specs import tool

    def echo(text: str) -> str:
        """Echo the text.

        Args:
            text: What to echo.
        """
        return text

    script = (
        "import json, os, urllib.request as u; url = os.environ['TAURL_TOOLS_URL']; "
        "names = [t['function']['name'] for t in json.load(u.urlopen(url))['tools']]; "
        "r = u.Request(url + '/call', data=json.dumps({'id': 'c1', 'type': 'function', 'function': "
        "{'name': 'echo', 'arguments': json.dumps({'text': 'hi'})}}).encode(), "
        "headers={'Content-Type': 'application/json'}); "
        "print(names[0], json.load(u.urlopen(r))['message']['content'])"
    )
    agent = AgentConfig(command=(sys.executable, "-c", script), timeout_s=30)
    with ProxyServer(None, tok, tools=ProxyTools.from_specs([tool(echo)])) as proxy:
        ep = proxy.open("c")
        answer, error = asyncio.run(run_agent(agent, None, proxy, "c", "task"))
        assert (answer, error) == ("echo hi", None)
        assert [(r.tool, r.decision, r.status) for _, r in ep.receipts] == [
            ("echo", "allowed", "ok")
        ]
