"""MCP tools behind the host gate: a real MCP server (taurl.envs.mcp.server, written with
the SDK) over stdio and streamable HTTP; listing, gating, receipts, the real agent loop,
a server that crashes or hangs mid-episode.

The server's ``--log`` file records every call it receives: the proof that a denied call
never reached it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("mcp")

from mcp.types import Tool, ToolAnnotations  # noqa: E402

from taurl.data.trajectory import StopReason, validate_trajectory  # noqa: E402
from taurl.envs import make_tasks  # noqa: E402
from taurl.envs.mcp import SubmissionVerifier, expert, tool_call  # noqa: E402
from taurl.envs.mcp.env import MCPEnv  # noqa: E402
from taurl.errors import ConfigError  # noqa: E402
from taurl.policy import build_tokenizer  # noqa: E402
from taurl.rollout.loop import RolloutConfig, run_episode  # noqa: E402
from taurl.rollout.synth import ScriptedEngine  # noqa: E402
from taurl.tools import Gate, GateConfig, ToolBox, ToolCall  # noqa: E402
from taurl.tools.mcp import (  # noqa: E402
    MCPClient,
    MCPServerConfig,
    mcp_tool_specs,
    shared_client,
    tool_scopes,
)
from taurl.tools.openai_calls import call_gated  # noqa: E402

SERVER = [sys.executable, "-m", "taurl.envs.mcp.server"]


def stdio(log, *flags, **options) -> MCPServerConfig:
    return MCPServerConfig.from_dict(
        {
            "name": "table",
            "command": [*SERVER, "--log", str(log), *flags],
            "stderr": f"{log}.stderr",
            **options,
        }
    )


def received(log) -> list[dict]:
    return [json.loads(line) for line in open(log)] if os.path.exists(log) else []


def run(box, gate, name, **args):
    return asyncio.run(box.run(ToolCall(name, args), gate))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One stdio server for the listing and gating tests: (client, specs, log path)."""
    log = tmp_path_factory.mktemp("mcp") / "calls.jsonl"
    client = MCPClient(stdio(log))
    specs = mcp_tool_specs([client.config], clients={"table": client})
    yield client, specs, log
    client.close()


@pytest.fixture(scope="module")
def tok():
    env_tools = [{"type": "function", "function": {"name": n, "description": "x", "parameters": {}}}
                 for n in ("table__lookup", "table__write_note", "submit")]
    texts = [t.prompt for t in make_tasks("mcp-v0", "train", n=12)] + [
        MCPEnv.system_prompt,
        json.dumps(env_tools),
    ]
    return build_tokenizer(texts * 4, vocab_size=600, model_max_length=8192)


def play(tok, env, actions, task=None):
    task = task or make_tasks("mcp-v0", "train", n=1, seed=3)[0]
    cfg = RolloutConfig(max_turns=8, max_context=8192)
    traj = asyncio.run(
        run_episode(
            ScriptedEngine(tok, actions, max_context=8192), env, tok, task, seed=0, config=cfg
        )
    )
    return validate_trajectory(traj), task


# -- config and scopes (no server) --------------------------------------------------------


def test_config_problems_are_reported_together():
    with pytest.raises(ConfigError) as e:
        MCPServerConfig.from_dict({"name": "a.b", "command": ["x"], "url": "http://example.com/mcp",
                                   "scopes": {"t": ["root"]}, "timeout_s": 0, "max_restarts": -1})
    text = str(e.value)
    for part in (
        "'a.b' must be 1-30 letters", "exactly one of command", "not a loopback address",
        "unknown ['root']", "timeout_s must be a number > 0", "max_restarts must be an int >= 0",
    ):
        assert part in text
    with pytest.raises(ConfigError, match="unknown key 'cmd'"):
        MCPServerConfig.from_dict({"name": "a", "cmd": "x"})
    assert MCPServerConfig(name="a", url="http://127.0.0.1:9/mcp").url
    assert MCPServerConfig(name="a", url="http://[::1]:9/mcp").url


def test_without_the_sdk_the_error_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'taurl\[mcp\]'"):
        mcp_tool_specs([{"name": "table", "command": SERVER}])


def test_scopes_follow_the_annotations_with_the_spec_defaults():
    def t(**hints):
        return Tool(
            name="t",
            input_schema={"type": "object"},
            annotations=ToolAnnotations(**hints) if hints else None,
        )

    assert tool_scopes(t()) == {"write", "destructive", "network"}  # says nothing: may do anything
    assert tool_scopes(t(read_only_hint=True)) == {"read", "network"}
    assert tool_scopes(t(read_only_hint=True, open_world_hint=False)) == {"read"}
    assert tool_scopes(t(destructive_hint=False, open_world_hint=False)) == {"write"}
    assert tool_scopes(t(), override=["read"]) == {"read"}  # the config overrides the server's word


# -- listing and the gate (one stdio server) ------------------------------------------------


def test_tools_are_listed_namespaced_with_their_schemas(served):
    client, specs, _ = served
    by_name = {s.name: s for s in specs}
    assert sorted(by_name) == ["table__lookup", "table__write_note"]
    lookup = by_name["table__lookup"].openai()["function"]
    assert lookup["parameters"] == {
        "type": "object",
        "properties": {"item": {"type": "string"}},
        "required": ["item"],
    }
    assert lookup["description"].startswith("Look up the stock code of an item")
    assert by_name["table__lookup"].scopes == {"read"} and by_name["table__write_note"].scopes == {
        "write"
    }
    assert by_name["table__lookup"].is_async and client.connects == 1


def test_the_config_picks_tools_and_overrides_scopes(served):
    client, _, _ = served
    cfg = MCPServerConfig.from_dict(
        {
            "name": "table",
            "command": client.config.command,
            "tools": ["lookup"],
            "scopes": {"lookup": ["read", "network"]},
            "cost": {"lookup": 2},
        }
    )
    (only,) = mcp_tool_specs([cfg], clients={"table": client})
    assert only.name == "table__lookup" and only.scopes == {"read", "network"} and only.cost == 2.0
    with pytest.raises(ConfigError) as e:
        mcp_tool_specs(
            [
                {
                    "name": "table",
                    "command": ["x"],
                    "tools": ["lookup", "nope"],
                    "scopes": {"gone": ["read"]},
                }
            ],
            clients={"table": client},
        )
    assert "has no tool 'nope'" in str(e.value) and "scopes given for 'gone'" in str(e.value)
    # a server that cannot start: said before any episode
    with pytest.raises(ConfigError, match="could not be listed"):
        mcp_tool_specs(
            [{"name": "broken", "command": [sys.executable, "-c", "pass"], "connect_timeout_s": 5}]
        )


def test_a_server_stuck_in_the_handshake_is_refused_and_stopped(tmp_path):
    pid_file = tmp_path / "pid"
    stuck = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    )
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="could not be started: TimeoutError"):
        mcp_tool_specs(
            [{"name": "stuck", "command": [sys.executable, "-c", stuck], "connect_timeout_s": 2}]
        )
    assert time.perf_counter() - t0 < 20
    pid = int(pid_file.read_text())
    for _ in range(100):
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid)


def test_a_gated_call_reaches_the_server_and_leaves_a_receipt(served):
    _, specs, log = served
    box, gate = ToolBox(specs), Gate(specs, GateConfig(allow=frozenset({"table__lookup"})))
    out = run(box, gate, "table__lookup", item="Copper  Kettle")
    assert out.status == "ok" and out.observation == "CK-4417" and not out.invalid
    assert (
        out.receipt.decision == "allowed"
        and out.receipt.tool == "table__lookup"
        and out.receipt.latency_s > 0
    )
    assert {"tool": "lookup", "arguments": {"item": "Copper  Kettle"}}.items() <= received(log)[
        -1
    ].items()
    assert gate.calls == 1


def test_forbidden_tools_are_refused_with_a_receipt_and_never_reach_the_server(served):
    _, specs, log = served
    before = len(received(log))
    box = ToolBox(specs)
    not_listed = run(
        box, Gate(specs, GateConfig(allow=frozenset({"table__lookup"}))), "table__write_note",
        item="oak stool", note="x",
    )
    no_scope = run(box, Gate(specs, GateConfig(scopes=frozenset({"read"}))), "table__write_note",
                   item="oak stool", note="x")
    for out, rule in ((not_listed, "not_allowed"), (no_scope, "scope")):
        assert out.status == "denied" and out.invalid and out.decision.rule == rule
        assert out.receipt.decision == "denied" and out.receipt.reason.startswith(f"{rule}: ")
        assert out.decision.truncate and out.decision.penalty == -1.0
    assert len(received(log)) == before  # nothing reached the server
    allowed = run(box, Gate(specs, GateConfig()), "table__write_note", item="oak stool", note="x")
    # the same call, allowed
    assert allowed.status == "ok" and received(log)[-1]["tool"] == "write_note"


def test_malformed_arguments_fail_schema_validation_before_the_server(served):
    _, specs, log = served
    before = len(received(log))
    box, gate = ToolBox(specs), Gate(specs)
    wrong_type = run(box, gate, "table__lookup", item=3)
    missing = run(box, gate, "table__lookup")
    assert (
        wrong_type.decision.rule == "schema"
        and "argument 'item' must be a string, got integer" in wrong_type.observation
    )
    assert (
        missing.decision.rule == "schema"
        and "missing required argument 'item'" in missing.observation
    )
    assert wrong_type.receipt.status == "denied" and len(received(log)) == before


def test_a_server_side_error_is_a_counted_tool_error_and_keeps_the_connection(served):
    client, specs, _ = served
    out = run(ToolBox(specs), Gate(specs), "table__lookup", item="anvil")
    assert (
        out.status == "error"
        and "no item named 'anvil'" in out.error
        and out.receipt.decision == "allowed"
    )
    assert client.starts == 1 and client.transport_failures == 0


def test_call_gated_takes_openai_tool_calls(served):
    _, specs, log = served
    box, gate = ToolBox(specs), Gate(specs, GateConfig(scopes=frozenset({"read"})))

    def tc(name, arguments, id_="call_1"):
        return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}

    ok = asyncio.run(call_gated(tc("table__lookup", '{"item": "oak stool"}'), box, gate))
    assert ok.message == {"role": "tool", "tool_call_id": "call_1", "content": "OS-7781"}
    assert ok.outcome.receipt.status == "ok"
    before = len(received(log))
    denied = asyncio.run(
        call_gated(tc("table__write_note", {"item": "a", "note": "b"}, "c2"), box, gate)
    )
    assert denied.outcome.receipt.status == "denied" and denied.message["content"].startswith(
        "Error: tool "
    )
    bad = asyncio.run(call_gated(tc("table__lookup", '{"item": '), box, gate))
    assert (
        bad.outcome.invalid
        and bad.outcome.receipt is None
        and "not valid JSON" in bad.message["content"]
    )
    assert len(received(log)) == before


# -- from an env, through the real agent loop -------------------------------------------------


def test_mcp_tools_from_an_env_through_the_real_loop(tok, tmp_path):
    log = tmp_path / "calls.jsonl"
    servers = [{"name": "table", "command": [*SERVER, "--log", str(log)], "stderr": f"{log}.err"}]
    env = MCPEnv(mcp_servers=servers)
    task = make_tasks("mcp-v0", "train", n=1, seed=3)[0]
    traj, _ = play(tok, env, expert(task, None), task)
    assert traj.stop_reason is StopReason.ANSWERED and traj.reward == pytest.approx(1.0)
    assert [t.receipt.tool for t in traj.turns] == ["table__lookup", "submit"]
    assert f"<tool_response>\n{task.answers[0]}\n</tool_response>" in traj.turns[0].observation_text
    prompt = tok.decode(list(traj.segments[0].token_ids))
    assert '"name": "table__lookup"' in prompt  # the server's tool is declared to the model
    assert [c["tool"] for c in received(log)] == ["lookup"]
    verifier = SubmissionVerifier()  # the evaluator's judge agrees, from the record alone
    assert (
        verifier(traj, task) == 1.0
        and verifier(traj, make_tasks("mcp-v0", "train", n=2, seed=3)[1]) == 0.0
    )
    # a forbidden call from the same env: refused, truncated with the constraint penalty
    denied, _ = play(tok, env, [tool_call("table__write_note", item="a", note="b")], task)
    assert (
        denied.stop_reason is StopReason.TOOL_BUDGET and denied.turns[0].receipt.status == "denied"
    )
    assert denied.reward_components["constraint"] == -1.0 and len(received(log)) == 1
    assert verifier(denied, task) == 0.0
    # the env's own allow-list refuses a tool whose scope it grants; an env of the same
    # servers shares the connection: no second server process
    strict = MCPEnv(
        mcp_servers=servers, allow=["table__lookup", "submit"], scopes=["read", "write"],
        max_calls=4,
    )
    refused, _ = play(tok, strict, [tool_call("table__write_note", item="a", note="b")], task)
    assert refused.turns[0].receipt.reason.startswith("not_allowed: ") and len(received(log)) == 1
    assert (
        shared_client(MCPServerConfig.from_dict(servers[0])).starts == 1
        and len({c["pid"] for c in received(log)}) == 1
    )
    # the sync Env API (step) reaches the same server from outside any event loop
    env.reset(task, seed=0)
    assert [env.step(a)[0] for a in expert(task, None)] == [
        task.answers[0],
        "Submission received: correct.",
    ]


def test_a_server_that_crashes_mid_episode_is_a_counted_tool_error(tok, tmp_path):
    log = tmp_path / "calls.jsonl"
    servers = [
        {
            "name": "table",
            "command": [*SERVER, "--log", str(log), "--crash-after", "2"],
            "max_restarts": 1,
            "stderr": f"{log}.err",
        }
    ]
    env = MCPEnv(mcp_servers=servers)
    task = make_tasks("mcp-v0", "train", n=1, seed=3)[0]
    look = tool_call("table__lookup", item=task.metadata["item"])
    traj, _ = play(tok, env, [look, look, look, tool_call("submit", answer=task.answers[0])], task)
    statuses = [t.receipt.status for t in traj.turns]
    # the crash costs one call; the restart serves the next
    assert statuses == ["ok", "error", "ok", "ok"]
    assert "failed during the call" in traj.turns[1].error and traj.num_errors == 1
    assert traj.stop_reason is StopReason.ANSWERED and traj.reward == pytest.approx(1.0)
    assert len({c["pid"] for c in received(log)}) == 2  # a second process served the third call
    # the restarts are spent: the next crash leaves every call failing fast, and the
    # episode ends cleanly as an error (an invalid sample), never a crash of the run
    traj2, _ = play(tok, env, [look] * 6, task)
    assert traj2.stop_reason is StopReason.ERROR and traj2.truncated and not traj2.valid
    assert [t.receipt.status for t in traj2.turns] == ["error"] * 3
    assert "restart(s) are spent" in traj2.turns[-1].error


def test_a_hanging_server_times_out_as_a_counted_tool_error(tmp_path):
    log = tmp_path / "calls.jsonl"
    client = MCPClient(stdio(log, "--hang-on", "lookup", timeout_s=1.5))
    specs = mcp_tool_specs([client.config], clients={"table": client})
    box, gate = ToolBox(specs), Gate(specs)
    ticks = []

    async def call_and_tick():  # the rollout's loop keeps running while the server hangs
        task = asyncio.ensure_future(
            box.run(ToolCall("table__lookup", {"item": "oak stool"}), gate)
        )
        while not task.done():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.05)
        return task.result()

    t0 = time.perf_counter()
    out = asyncio.run(call_and_tick())
    assert len(ticks) >= 10 and ticks[-1] - ticks[0] >= 1.0  # ~30 ticks of 50 ms over the 1.5 s
    assert (
        out.status == "timeout"
        and out.receipt.decision == "allowed"
        and "did not answer 'lookup' within 1.5 s" in out.error
    )
    assert time.perf_counter() - t0 < 15
    hung_pid = received(log)[0]["pid"]
    for _ in range(100):  # the hung process is stopped (SIGTERM/SIGKILL after the grace period)
        if not _alive(hung_pid):
            break
        time.sleep(0.1)
    assert not _alive(hung_pid) and client.transport_failures == 1
    # a fresh server answers
    again = run(box, gate, "table__write_note", item="oak stool", note="n")
    assert again.status == "ok" and client.restarts == 1
    client.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(")")[-1].split()[0] != "Z"


# -- streamable HTTP on loopback ------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamable_http_on_loopback_through_the_real_loop(tok, tmp_path):
    port, log = _free_port(), tmp_path / "calls.jsonl"
    proc = subprocess.Popen(
        [*SERVER, "--transport", "http", "--port", str(port), "--log", str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        env = MCPEnv(mcp_servers=[{"name": "table", "url": f"http://127.0.0.1:{port}/mcp"}])
        task = make_tasks("mcp-v0", "holdout", n=1)[0]
        traj, _ = play(tok, env, expert(task, None), task)
        assert traj.stop_reason is StopReason.ANSWERED and traj.reward == pytest.approx(1.0)
        assert traj.provenance["mcp_servers"][0]["transport"] == "http"
        assert [c["tool"] for c in received(log)] == ["lookup"] and received(log)[0][
            "pid"
        ] == proc.pid
    finally:
        proc.terminate()
        proc.wait(10)
