"""MCP for any agent: an Agents SDK agent's own MCP client (``MCPServerStreamableHttp``), and a
pydantic-ai agent's (``MCPToolset``), call `mcp-server-time` (from the registry) through the
episode's MCP endpoint, behind taurl's gate.

The time server runs behind a tee (tests/fixtures/mcp_tee.py) that logs every message the
client sends it: the proof of what reached the server. The config marks ``convert_time``
as needing the ``network`` scope (the config's word replaces the server's annotations,
`taurl.tools.mcp`), which the gate does not grant: a forbidden scope. The model's replies
are scripted (`ReplyEngine`): what is under test is the path from the agent's MCP client
to the server and back into the record, not the policy. Last, the SDK's streamed run
(``Runner.run_streamed``) on the Responses API's event stream, reasoning items included.
"""

from __future__ import annotations

import asyncio
import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

agents = pytest.importorskip("agents")
pytest.importorskip("mcp_server_time")
pytest.importorskip("starlette")

from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.mcp import MCPServerStreamableHttp  # noqa: E402
from agents.models.openai_provider import OpenAIProvider  # noqa: E402

from taurl.data.trajectory import StopReason, validate_trajectory  # noqa: E402
from taurl.envs.search import generate_tasks  # noqa: E402
from taurl.errors import ConfigError  # noqa: E402
from taurl.policy import build_tokenizer  # noqa: E402
from taurl.proxy.experts import ReplyEngine  # noqa: E402
from taurl.proxy.runner import AgentConfig, run_agent_episode  # noqa: E402
from taurl.proxy.server import ProxyLimits, ProxyServer  # noqa: E402
from taurl.proxy.tools import ProxyTools  # noqa: E402
from taurl.rollout.episodes import EpisodeSpec  # noqa: E402
from taurl.tools.parsers import tool_call_text  # noqa: E402

set_tracing_disabled(True)  # the SDK's traces go to OpenAI's servers by default
TEE = Path(__file__).parent / "fixtures" / "mcp_tee.py"
TASK = generate_tasks("train", n=1, seed=0)[0]
NOW = tool_call_text("time__get_current_time", {"timezone": "Europe/Paris"})
CONVERT = tool_call_text("time__convert_time", {"source_timezone": "Europe/Paris", "time": "12:00",
                                                "target_timezone": "Asia/Tokyo"})


def time_tools(log: Path) -> dict:
    server = {
        "name": "time",
        "command": [
            sys.executable, str(TEE), str(log), "--", sys.executable, "-m", "mcp_server_time",
            "--local-timezone", "UTC",
        ],
        "scopes": {"convert_time": ["read", "network"]},
        "stderr": f"{log}.err",
    }
    return {"mcp_servers": [server], "scopes": ["read"]}


def reached(log: Path) -> list[str]:
    """The tools the server was asked to call (from the tee's log)."""
    msgs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [m["params"]["name"] for m in msgs if m.get("method") == "tools/call"]


async def clock_agent(task: str, base_url: str, retriever_url: str, mcp_url: str) -> str:
    """An Agents SDK agent at its defaults, with its own MCP client on the episode's endpoint."""
    async with MCPServerStreamableHttp(params={"url": mcp_url}, name="taurl-tools") as server:
        agent = Agent(name="clock", instructions="Use the tools.", mcp_servers=[server])
        result = await Runner.run(
            agent, task, max_turns=4,
            run_config=RunConfig(model_provider=OpenAIProvider(base_url=base_url, api_key="x")),
        )
    return str(result.final_output)


def messages(e: BaseException) -> str:
    """Every message in an exception (group), the client's task group wraps the server's error."""
    return " ".join([str(e), *(messages(x) for x in getattr(e, "exceptions", ()))])


async def pydantic_ai_clock_agent(
    task: str, base_url: str, retriever_url: str, mcp_url: str
) -> str:
    """A pydantic-ai agent (Chat Completions) whose toolset is the episode's MCP endpoint."""
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider as PydanticOpenAIProvider

    model = OpenAIChatModel(
        "policy", provider=PydanticOpenAIProvider(base_url=base_url, api_key="x")
    )
    result = await PydanticAgent(model, toolsets=[MCPToolset(mcp_url)]).run(task)
    return str(result.output)


CLIENTS = {
    "openai-agents": (clock_agent, "agents"),
    "pydantic-ai": (pydantic_ai_clock_agent, "pydantic_ai"),
}


@pytest.fixture(scope="module")
def tok():
    texts = [t.prompt for t in generate_tasks("train", n=40)] + [NOW, CONVERT]
    return build_tokenizer(texts * 4, vocab_size=600, model_max_length=16384)


def play(tok, tools: ProxyTools, replies: list[str], fn=clock_agent):
    agent = AgentConfig(callable=f"test:{fn.__name__}", timeout_s=60, max_calls=4, name=fn.__name__)
    limits = ProxyLimits(max_calls=4, max_action_tokens=200, max_context=16384)
    with ProxyServer(None, tok, limits=limits, tools=tools) as proxy:
        trajs = asyncio.run(
            run_agent_episode(
                proxy, agent, fn, EpisodeSpec("e0", TASK, 0, "g"), run_id="t", env_name="search-v0",
                env_version="1", verifier=None, engine=ReplyEngine(tok, replies, 16384),
                source="expert",
            )
        )
    for t in trajs:
        validate_trajectory(t)
    return trajs


@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_frameworks_own_mcp_client_calls_mcp_server_time_through_the_gate(client, tok, tmp_path):
    fn, module = CLIENTS[client]
    pytest.importorskip(module)
    log = tmp_path / "to_server.jsonl"
    tools = ProxyTools.from_config(time_tools(log))
    trajs = play(tok, tools, [NOW, CONVERT, "<answer>noon</answer>"], fn)
    traj = trajs[-1]
    assert len(trajs) == 1  # the SDK sent back what it got: one chain
    allowed, denied = traj.turns[0].receipt, traj.turns[1].receipt
    assert (allowed.tool, allowed.decision, allowed.status) == (
        "time__get_current_time",
        "allowed",
        "ok",
    )
    assert "Europe/Paris" in traj.turns[0].observation_text  # the server's answer reached the model
    # convert_time needs network, which the gate does not grant: refused, a receipt, never sent
    assert (denied.tool, denied.decision, denied.reason.split(":")[0]) == (
        "time__convert_time",
        "denied",
        "scope",
    )
    assert reached(log) == ["get_current_time"]
    assert (
        traj.stop_reason is StopReason.TOOL_BUDGET and traj.reward_components["constraint"] == -1.0
    )
    # the MCP tools were declared in the agent's first model call (listed before it)
    first_prompt = tok.decode(traj.segments[0].token_ids)
    assert "time__get_current_time" in first_prompt and "time__convert_time" in first_prompt


def test_the_tool_list_is_served_before_the_first_model_call(tok, tmp_path):
    from mcp import Client

    tools = ProxyTools.from_config(time_tools(tmp_path / "log.jsonl"))
    with ProxyServer(None, tok, tools=tools, open_on_call=True) as proxy:
        async def listed() -> list[str]:
            async with Client(proxy.mcp_url("fresh")) as c:
                return sorted(t.name for t in (await c.list_tools()).tools)

        assert asyncio.run(listed()) == ["time__convert_time", "time__get_current_time"]
        ep = proxy.episodes["fresh"]
        assert ep.calls == 0 and not ep.capture.chains  # no model call, no chain
        proxy.end("fresh")
        # after the end, the endpoint refuses the episode
        with pytest.raises(Exception) as e:  # noqa: B017
            asyncio.run(listed())
        assert "has ended" in messages(e.value)


def test_taurl_proxy_mcp_config_is_checked_before_anything_starts(tmp_path, tok):
    from taurl.policy.model import build_default_policy
    from taurl.proxy.cli import mcp_tools, start_proxy

    bad = tmp_path / "bad.yaml"
    bad.write_text("mcp_servers: []\nbogus: 1\n")
    with pytest.raises(ConfigError, match=r"--mcp .*bad.yaml: agent.tools: unknown key"):
        mcp_tools(str(bad))
    good = tmp_path / "mcp.yaml"
    good.write_text(json.dumps(time_tools(tmp_path / "log.jsonl")))
    model_dir = tmp_path / "m"
    build_default_policy(
        [t.prompt for t in generate_tasks("train", n=40)], model_dir, size="tiny", seed=0
    )
    args = Namespace(
        model=str(model_dir), host="127.0.0.1", port=0, temperature=None, max_tokens=8, max_calls=4,
        retriever=False, seed=0, mcp=str(good),
    )
    proxy = start_proxy(args)
    try:
        assert proxy.mcp_url("x").endswith("/rollouts/x/mcp")
        assert sorted(d["function"]["name"] for d in proxy.tools.declarations) == [
            "time__convert_time",
            "time__get_current_time",
        ]
    finally:
        proxy.stop()


def test_an_agents_sdk_streamed_run_sends_back_its_reasoning_items_in_one_chain(tok):
    @function_tool
    def search(query: str) -> str:
        """Search an encyclopedia."""
        return "Lyon is in France."

    async def streamed(base_url: str) -> tuple[set, str]:
        agent = Agent(name="geo", instructions="Be brief.", tools=[search])
        run = Runner.run_streamed(
            agent,
            "Where is Lyon?",
            run_config=RunConfig(model_provider=OpenAIProvider(base_url=base_url, api_key="x")),
        )
        kinds = {ev.type async for ev in run.stream_events()}
        return kinds, str(run.final_output)

    replies = [
        "<think>Search.</think>" + tool_call_text("search", {"query": "Lyon"}),
        "<think>Found.</think>France",
    ]
    with ProxyServer(
        None, tok, limits=ProxyLimits(max_action_tokens=200, max_context=16384)
    ) as proxy:
        proxy.open("e", engine=ReplyEngine(tok, replies, 16384))
        kinds, answer = asyncio.run(streamed(proxy.base_url("e")))
        ep = proxy.pop("e")
    assert answer == "France" and "raw_response_event" in kinds
    (chain,) = ep.capture.chains  # the reasoning items it sent back rebuilt the sampled text
    assert [c.text for c in chain.calls][0].startswith("<think>Search.</think><tool_call>")
    assert "Lyon is in France." in tok.decode(
        chain.segments[chain.calls[1].observation_segment].token_ids
    )
