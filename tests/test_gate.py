"""The host gate and the executor: each rule, budgets, approval, receipts, timeouts."""

from __future__ import annotations

import asyncio
import time

import pytest

from taurl.errors import ConfigError
from taurl.tools import Gate, GateConfig, RuleAction, ToolBox, ToolCall, tool


@tool(scopes=("read",), cost=1.0)
def look(path: str) -> str:
    """Read something."""
    return f"contents of {path}"


@tool(scopes=("write", "destructive"))
def wipe(path: str) -> str:
    """Delete something."""
    return f"wiped {path}"


@tool(scopes=("network",))
async def fetch(url: str) -> str:
    """Fetch a URL."""
    return url


@tool(timeout_s=0.05)
async def hang() -> str:
    """Never returns."""
    await asyncio.sleep(3600)
    return ""


@tool
def boom(n: int) -> str:
    """Raises."""
    raise ValueError(f"bad n={n}")


@tool
def big() -> str:
    """Returns a lot."""
    return "x" * 50_000


@tool
def data() -> dict:
    """Returns JSON."""
    return {"a": [1, 2]}


TOOLS = [look, wipe, fetch, hang, boom, big, data]


def run(box: ToolBox, gate: Gate, name: str, **args):
    return asyncio.run(box.run(ToolCall(name, args), gate))


@pytest.fixture
def box() -> ToolBox:
    return ToolBox(TOOLS, max_output_chars=1000)


def test_allowed_call_has_an_ok_receipt(box):
    gate = Gate(TOOLS)
    out = run(box, gate, "look", path="a.txt")
    assert out.observation == "contents of a.txt" and not out.invalid and out.error is None
    r = out.receipt
    assert (r.tool, r.arguments, r.decision, r.status) == (
        "look", {"path": "a.txt"}, "allowed", "ok",
    )
    assert r.output_chars == len("contents of a.txt") and r.latency_s >= 0
    assert run(box, gate, "data").observation == '{"a": [1, 2]}'


@pytest.mark.parametrize(
    ("name", "args", "rule", "says"),
    [
        ("lok", {"path": "a"}, "unknown_tool", "Did you mean 'look'?"),
        (
            "look", {"path": 3}, "schema",
            "argument 'path' must be a string, got integer. Expected: look(path: string)",
        ),
        ("look", {}, "schema", "missing required argument 'path'"),
        ("fetch", {"url": "http://x"}, "scope", "needs the network permission"),
        ("wipe", {"path": "a"}, "scope", "needs the destructive/write permission"),
    ],
)
def test_denials_explain(box, name, args, rule, says):
    cfg = GateConfig(scopes=frozenset({"read"}))
    out = run(box, Gate(TOOLS, cfg), name, **args)
    assert out.invalid and out.observation.startswith("Error: ") and says in out.observation
    assert out.receipt.decision == "denied" and out.receipt.status == "denied"
    assert out.receipt.reason.startswith(rule + ":") and out.decision.rule == rule


def test_allow_lists_env_and_task(box):
    env_only = Gate(TOOLS, GateConfig(allow={"look", "data"}))
    assert run(box, env_only, "boom", n=1).decision.rule == "not_allowed"
    assert "not allowed in this environment" in run(box, env_only, "boom", n=1).observation
    task = Gate(TOOLS, GateConfig(), task_allow=["data"])
    out = run(box, task, "look", path="a")
    assert out.decision.rule == "not_allowed" and "this task" in out.observation
    assert out.decision.truncate and out.decision.penalty == -1.0  # a hard rule by default
    assert run(box, task, "data").receipt.status == "ok"


def test_budgets(box):
    gate = Gate(TOOLS, GateConfig(max_calls=3, max_calls_per_tool={"look": 2}, max_cost=10))
    assert [run(box, gate, "look", path="a").receipt.status for _ in range(2)] == ["ok", "ok"]
    third = run(box, gate, "look", path="a")
    assert third.decision.rule == "max_calls_per_tool" and third.decision.truncate
    assert third.decision.stop_reason == "tool_budget"
    assert run(box, gate, "data").receipt.status == "ok"
    assert run(box, gate, "data").decision.rule == "max_calls"
    costly = Gate(TOOLS, GateConfig(max_cost=1.5))
    assert run(box, costly, "look", path="a").receipt.status == "ok"
    assert run(box, costly, "look", path="a").decision.rule == "max_cost"
    assert costly.cost == 1.0 and costly.calls == 1  # denied calls are not counted


def test_wall_budget_caps_the_timeout(box):
    gate = Gate(TOOLS, GateConfig(max_wall_s=0.03))
    t0 = time.perf_counter()
    out = run(box, gate, "hang")
    assert out.receipt.status == "timeout" and time.perf_counter() - t0 < 1.0
    assert "timed out after 0.03 s" in out.observation
    assert run(box, gate, "data").decision.rule == "max_wall_s"


def test_approval_hook():
    seen = []

    def approve(call, spec):
        seen.append(call.arguments["path"])
        return True if call.arguments["path"].startswith("tmp/") else "only tmp/ may be wiped"

    box = ToolBox(TOOLS)
    scopes = frozenset({"read", "write", "destructive"})
    gate = Gate(TOOLS, GateConfig(scopes=scopes, approve=approve))
    assert run(box, gate, "wipe", path="tmp/x").receipt.status == "ok"
    denied = run(box, gate, "wipe", path="/etc")
    assert denied.decision.rule == "approval" and "only tmp/ may be wiped" in denied.observation
    assert not denied.decision.truncate  # soft by default: the model may try something else
    assert seen == ["tmp/x", "/etc"]
    no_hook = Gate(TOOLS, GateConfig(scopes=scopes))
    assert "no approver is configured" in run(box, no_hook, "wipe", path="tmp/x").observation

    def broken(call, spec):
        raise RuntimeError("approval service down")

    out = run(box, Gate(TOOLS, GateConfig(scopes=scopes, approve=broken)), "wipe", path="tmp/x")
    assert out.decision.rule == "approval" and "approval service down" in out.observation


def test_rules_are_configurable(box):
    strict = GateConfig(
        rules={"unknown_tool": RuleAction(truncate=True, penalty=-0.5, stop_reason="error")}
    )
    d = run(box, Gate(TOOLS, strict), "nope").decision
    assert (d.truncate, d.penalty, d.stop_reason) == (True, -0.5, "error")
    lenient = GateConfig(max_calls=1, rules={})
    gate = Gate(TOOLS, lenient)
    run(box, gate, "data")
    assert not run(box, gate, "data").decision.truncate
    with pytest.raises(ConfigError) as e:
        GateConfig(scopes={"root"}, max_calls=0, rules={"nope": RuleAction()})
    assert len(e.value.problems) == 3


def test_tool_failures_are_observations(box):
    gate = Gate(TOOLS)
    out = run(box, gate, "boom", n=7)
    assert out.receipt.status == "error" and out.error == "tool 'boom' failed: ValueError: bad n=7"
    assert out.observation == f"Error: {out.error}" and not out.invalid
    out = run(box, gate, "hang")
    assert out.receipt.status == "timeout" and "timed out after 0.05 s" in out.error
    out = run(box, gate, "big")
    assert out.receipt.truncated_output and out.receipt.output_chars == 50_000
    assert len(out.observation) <= 1000 and "characters cut" in out.observation


def test_step_parses_then_runs_the_first_call(box):
    gate = Gate(TOOLS)
    out = asyncio.run(box.step("no call here", gate))
    assert out.invalid and out.receipt is None and out.parse_kind == "no_call"
    two = '<tool_call>{"name": "data", "arguments": {}}</tool_call>' * 2
    out = asyncio.run(box.step(two, gate))
    assert out.receipt.status == "ok" and "1 more were ignored" in out.observation


def test_huge_arguments_are_cut_in_the_receipt(box):
    out = run(box, Gate(TOOLS), "look", path="p" * 100_000)
    assert out.receipt.status == "ok" and len(out.receipt.arguments["path"]) < 2100


def test_xml_parser_box():
    box = ToolBox(TOOLS, parser="xml")
    out = asyncio.run(box.step("<think>x</think><look>notes.txt</look>", Gate(TOOLS)))
    assert out.receipt.status == "ok" and out.observation == "contents of notes.txt"
    out = asyncio.run(box.step("<boom>seven</boom>", Gate(TOOLS)))
    assert (
        out.decision.rule == "schema"
        and "argument 'n' must be an integer, got string" in out.observation
    )
