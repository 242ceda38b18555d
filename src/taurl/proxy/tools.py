"""Tools the proxy runs for an agent, behind the host gate: MCP servers' tools (or any ToolSpecs).

An agent behind the proxy may call tools that taurl runs for it, so that every call passes
the same host gate as in the built-in loop (docs/design.md#safety: schema, allow-list, scopes,
budgets, receipts). Per episode:

    GET  /rollouts/{id}/tools          {"tools": [...]}: OpenAI function declarations, ready
                                       to pass as `tools=` to chat.completions.create
    POST /rollouts/{id}/tools/call     one OpenAI ``tool_calls`` item (as the SDK returns it)
                                       -> {"message": the ``tool`` message to append,
                                           "receipt": the gate's decision and the execution,
                                           "episode_ended": true when the gate truncated it}

Each episode has its own `Gate` (budgets count per episode). A call the gate refuses never
reaches the tool and leaves a receipt (``decision: denied``); a refusal whose rule
truncates (a forbidden tool, a spent budget) ends the episode there: its record stops with
the gate's stop reason and penalty, and the agent's later model calls are refused (409).
A tool that fails — an MCP server that crashes, hangs past its timeout or reports an
error — is one counted tool error (`Turn.error`, `Trajectory.num_errors`), never a
failure of the episode or the run.

The config (`agent.tools`):

    tools:
      mcp_servers: [{name: table, command: [python, -m, taurl.envs.mcp.server]}]
      allow: [table__lookup]     # the gate's allow-list (default: every listed tool)
      scopes: [read]             # the scopes the gate grants (default: read)
      max_calls: 8               # tool calls per episode; max_wall_s, max_cost likewise
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from taurl.errors import ConfigError
from taurl.tools.executor import ToolBox
from taurl.tools.gate import Gate, GateConfig
from taurl.tools.openai_calls import GatedCall, call_gated
from taurl.tools.specs import ToolSpec

TOOL_KEYS = ("mcp_servers", "allow", "scopes", "max_calls", "max_wall_s", "max_cost")


@dataclass(frozen=True)
class ProxyTools:
    """The tools and the gate policy the proxy applies to every episode's tool calls."""

    toolbox: ToolBox
    gate: GateConfig

    @staticmethod
    def from_specs(specs: Sequence[ToolSpec], gate: GateConfig | None = None) -> ProxyTools:
        return ProxyTools(ToolBox(specs), gate or GateConfig(scopes=frozenset({"read"})))

    @staticmethod
    def from_config(d: Mapping[str, Any]) -> ProxyTools:
        """`agent.tools` (module docstring): connects to the MCP servers and lists their tools."""
        if problems := tools_problems(d):
            raise ConfigError(problems)
        from taurl.tools.mcp import mcp_tool_specs

        allow = d.get("allow")
        gate = GateConfig(allow=frozenset(allow) if allow is not None else None,
                          scopes=frozenset(d.get("scopes", ("read",))),
                          max_calls=d.get("max_calls"),
                          max_wall_s=d.get("max_wall_s"), max_cost=d.get("max_cost"))
        return ProxyTools(ToolBox(mcp_tool_specs(d["mcp_servers"])), gate)

    @property
    def declarations(self) -> list[dict[str, Any]]:
        return self.toolbox.declarations

    def new_gate(self) -> Gate:
        """One episode's gate (its own budgets)."""
        return Gate(list(self.toolbox.specs.values()), self.gate)

    async def call(self, tool_call: Any, gate: Gate) -> GatedCall:
        return await call_gated(tool_call if isinstance(tool_call, Mapping) else {}, self.toolbox,
                                gate)


def tools_problems(d: Any) -> list[str]:
    """Everything wrong with an `agent.tools` mapping, in words (empty when it is fine)."""
    if not isinstance(d, Mapping):
        return ["agent.tools must be a mapping with mcp_servers (and allow, scopes, max_calls)"]
    out = []
    if unknown := sorted(set(d) - set(TOOL_KEYS)):
        out.append(f"agent.tools: unknown key(s) {unknown}; known: {list(TOOL_KEYS)}")
    servers = d.get("mcp_servers")
    if not isinstance(servers, list) or not servers:
        out.append("agent.tools.mcp_servers must be a non-empty list of servers (name, and command "
                   "or url)")
    for key in ("allow", "scopes"):
        v = d.get(key)
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            out.append(f"agent.tools.{key} must be a list of names (got {v!r})")
    return out


def receipt_json(gated: GatedCall) -> dict[str, Any] | None:
    r = gated.outcome.receipt
    return None if r is None else asdict(r)
