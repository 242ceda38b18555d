"""mcp-v0: a tool env whose tools come from MCP servers, all behind the host gate.

Any env can do the same: `with_mcp_tools(tools, servers)` adds the servers' tools
(`taurl.tools.mcp`) to a `ToolEnv`'s own, and the built-in agent loop calls them through
the gate like any other. mcp-v0 is the example: its task is "find an item's stock code",
its default server is the stock-table server (`taurl.envs.mcp.server`, over stdio), and
its own tool is ``submit(answer)`` (exact match with the table's code ends the episode).

Options (env config): ``mcp_servers`` — a list of server mappings (`MCPServerConfig`:
name, command or url, tools, scopes, cost, timeout_s, max_restarts); ``allow`` — the
allow-list of tool names (namespaced, e.g. ``table__lookup``; None: every declared tool);
``scopes`` — the permission scopes granted (default ``[read]``: ``table__write_note``
needs ``write`` and is refused, truncating the episode with a −1 constraint penalty);
``max_calls``, ``max_wall_s``, ``max_cost`` — the gate's budgets; ``max_turns``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from taurl.envs.core import Task
from taurl.errors import ConfigError
from taurl.reward.stack import Verdict
from taurl.reward.verifiers import ExactMatchVerifier
from taurl.tools.gate import GateConfig
from taurl.tools.mcp import MCPServerConfig, mcp_tool_specs
from taurl.tools.specs import ToolSpec, tool
from taurl.tools.tool_env import ToolEnv

VERSION = "1"
DEFAULT_SERVERS = ({"name": "table", "command": [sys.executable, "-m", "taurl.envs.mcp.server"],
                    "timeout_s": 10.0},)
SYSTEM_PROMPT = ("You answer with the help of tools. Look the item up, then call submit with its "
                 "stock code. Make exactly one tool call per message.")


def with_mcp_tools(tools: Sequence[ToolSpec],
                   servers: Sequence[MCPServerConfig | Mapping[str, Any]]) -> list[ToolSpec]:
    """`tools` plus every tool of `servers` (namespaced); a name clash is a ConfigError."""
    specs = [*tools, *mcp_tool_specs(servers)]
    names = [s.name for s in specs]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ConfigError([f"tool {n!r} is declared by the env and by an MCP server; rename one"
                           for n in clashes])
    return specs


class MCPEnv(ToolEnv):
    """See the module docstring."""

    name = "mcp-v0"
    version = VERSION
    system_prompt = SYSTEM_PROMPT

    def __init__(self, *, mcp_servers: Sequence[Mapping[str, Any]] | None = None,
                 allow: Sequence[str] | None = None,
                 scopes: Sequence[str] = ("read",), max_calls: int | None = 8,
                 max_wall_s: float | None = 60.0, max_cost: float | None = None, max_turns: int = 6,
                 gate: GateConfig | None = None) -> None:
        servers = list(DEFAULT_SERVERS if mcp_servers is None else mcp_servers)
        if not servers:
            raise ConfigError("mcp_servers is empty; list at least one server (name and command or "
                              "url)")
        tools = with_mcp_tools([tool(self.submit)], servers)
        gate = gate or GateConfig(allow=frozenset(allow) if allow is not None else None,
                                  scopes=frozenset(scopes),
                                  max_calls=max_calls, max_wall_s=max_wall_s, max_cost=max_cost)
        super().__init__(tools, verifier_factory=ExactMatchVerifier, gate=gate, max_turns=max_turns,
                         submit_tool="submit")
        self.servers = [MCPServerConfig.from_dict(s) for s in servers]

    def submit(self, answer: str) -> str:
        """Submit the final answer (ends the episode).

        Args:
            answer: The stock code, e.g. "AB-1234".
        """
        return answer

    def _verdict_text(self, verdict: Verdict) -> str:
        return ("Submission received: correct." if verdict.passed
                else f"Submission received: {verdict.detail}")

    def _start(self, task: Task, seed: int | None) -> dict[str, Any]:
        servers = [{"name": s.name, "transport": "http" if s.url else "stdio",
                    "tools": sorted(n for n in self.toolbox.specs if n.startswith(f"{s.name}__"))}
                   for s in self.servers]
        return {"provenance": {"mcp_servers": servers}}
