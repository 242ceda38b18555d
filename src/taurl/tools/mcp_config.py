"""`MCPServerConfig`: how to reach one MCP server and what taurl exposes of it
(`taurl.tools.mcp`)."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from taurl.errors import ConfigError
from taurl.tools.specs import SCOPES

_NAME = re.compile(r"[A-Za-z0-9-]{1,30}")
LOOPBACK_HOSTS = ("localhost",)

@dataclass(frozen=True)
class MCPServerConfig:
    """One MCP server an env attaches (what a config's ``mcp_servers:`` list holds).

    name: the namespace of its tools (``{name}__{tool}``): letters, digits and ``-``.
    command / url: how to reach it — a stdio command line, or a loopback streamable-HTTP URL.
    env / cwd: the stdio child's extra environment variables and working directory.
    stderr: where the stdio child's stderr goes: a file path (appended), or None to share taurl's.
    tools: expose only these (the server's own names); None: all it lists.
    scopes: per tool (server's name), the permission scopes it needs; replaces annotations.
    cost: per tool, what one call costs against the gate's cost budget.
    timeout_s: the most one call may run; connect_timeout_s: the most a (re)connect may take.
    max_restarts: reconnects allowed over the client's life after a transport failure/timeout.
    """

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stderr: str | None = None
    tools: tuple[str, ...] | None = None
    scopes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    cost: Mapping[str, float] = field(default_factory=dict)
    timeout_s: float = 30.0
    connect_timeout_s: float = 30.0
    max_restarts: int = 3

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "mcp_servers") -> MCPServerConfig:
        """A config from a YAML/JSON mapping; every problem is reported together."""
        if isinstance(d, MCPServerConfig):
            return d
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: each server is a mapping with name and command or url, "
                              f"got {d!r}")
        known = set(cls.__dataclass_fields__)
        problems = [f"{where}: unknown key {k!r}; keys are {sorted(known)}" for k in d
                    if k not in known]
        if problems:
            raise ConfigError(problems)
        command = d.get("command", ())
        command = tuple(command.split()) if isinstance(command, str) else tuple(command)
        tools = d.get("tools")
        try:
            cfg = cls(name=d.get("name", ""), command=command, url=d.get("url", ""),
                      env=dict(d.get("env") or {}), cwd=d.get("cwd"), stderr=d.get("stderr"),
                      tools=tuple(tools) if tools is not None else None,
                      scopes={k: tuple(v) for k, v in (d.get("scopes") or {}).items()},
                      cost=dict(d.get("cost") or {}), timeout_s=d.get("timeout_s", 30.0),
                      connect_timeout_s=d.get("connect_timeout_s", 30.0),
                      max_restarts=d.get("max_restarts", 3))
        except TypeError as e:
            raise ConfigError(f"{where}: {e}") from None
        return cfg

    def __post_init__(self) -> None:
        who = f"MCP server {self.name!r}"
        problems = []
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            problems.append(f"MCP server name {self.name!r} must be 1-30 letters, digits or '-' "
                            "(it prefixes its tools)")
        if bool(self.command) == bool(self.url):
            problems.append(f"{who}: give exactly one of command (stdio) or url (streamable HTTP)")
        if self.url and (why := _not_loopback(self.url)):
            problems.append(f"{who}: url {self.url!r} {why}; taurl connects to MCP over HTTP on "
                            "loopback only (run the server on 127.0.0.1, or as a stdio command)")
        for tool_name, scopes in self.scopes.items():
            if bad := sorted(set(scopes) - set(SCOPES)):
                problems.append(f"{who}: scopes of {tool_name!r}: unknown {bad}; use {SCOPES}")
        problems += [f"{who}: cost of {k!r} must be a number >= 0, got {v!r}"
                     for k, v in self.cost.items()
                     if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0]
        for key in ("timeout_s", "connect_timeout_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                problems.append(f"{who}: {key} must be a number > 0, got {v!r}")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts,
                                                                 int) or self.max_restarts < 0:
            problems.append(f"{who}: max_restarts must be an int >= 0, got {self.max_restarts!r}")
        if problems:
            raise ConfigError(problems)

    def key(self) -> str:
        """Identity of the server for the shared-client cache."""
        return json.dumps({k: getattr(self, k) for k in ("name", "command", "url", "env", "cwd",
                                                         "stderr", "timeout_s",
                                                          "connect_timeout_s", "max_restarts")},
                          sort_keys=True, default=list)


def _not_loopback(url: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https"):
        return "is not an http(s) URL"
    host = parsed.hostname or ""
    if host in LOOPBACK_HOSTS:
        return ""
    try:
        return "" if ipaddress.ip_address(host).is_loopback else "is not a loopback address"
    except ValueError:
        return "is not a loopback address"
