"""MCP servers' tools as taurl tools: listed as JSON-Schema `ToolSpec`s, called through the gate.

    servers = [MCPServerConfig.from_dict({"name": "table", "command": ["python", "-m",
    "my.server"]})] specs = mcp_tool_specs(servers)          # [ToolSpec("table__lookup", ...), ...]
    box = ToolBox([*specs, my_submit])       # the same parse → gate → run as every tool

An MCP tool is an ordinary async `ToolSpec` once listed, so the host gate checks it
exactly like any other (unknown tool, allow-list, scopes, JSON-Schema arguments, budgets,
approval) and every call, allowed or denied, leaves a `ToolReceipt`. A denied call never
reaches the server.

Names are namespaced ``{server}__{tool}`` (`NAMESPACE_SEP`): two servers may both offer
``search`` without colliding. Not ``server.tool``: OpenAI function names (and
`taurl.tools.specs`) allow only letters, digits, ``_`` and ``-``.

Scopes: the server's tool annotations are read with the MCP spec's defaults — a tool that
does not say ``readOnlyHint`` may write, and then is ``destructive`` unless it says
``destructiveHint: false``; it may reach the world (``network``) unless it says
``openWorldHint: false``. So an unannotated tool is refused by a default gate (no
``network`` scope; ``destructive`` needs approval) until the config grants it: the
config's ``scopes: {tool: [read]}`` replaces what the server claims about a tool.
Annotations are the server's word; the config is the user's.

Transports: stdio (``command``: the server runs as a child process) or streamable HTTP
(``url``) on loopback only (127.0.0.1, ::1, localhost); `taurl.tools.mcp_config` holds a
server's config and its checks.

Failures never crash an episode or the run: an ``isError`` result, a server that dies
mid-call, a server that cannot start, a call that outlives its ``timeout_s`` — each is a
tool error (status ``error`` or ``timeout``, with a receipt) counted by the env.

Reconnect / restart policy: one connection per server config per process, shared by every
env (`shared_client`), opened on first use. A call that fails at the transport (the
process died, the connection closed) or times out closes the connection (a hung or dead
stdio server is killed: closing stdin, then SIGTERM/SIGKILL); the next call opens a new
one, at most ``max_restarts`` times over the client's life. After that every call fails
at once with a tool error saying so, and the env's ``max_consecutive_errors`` ends the
episode. A tool error the server reports (``isError``) keeps the connection.

The SDK is asyncio/anyio: each connection lives in one owner task on a dedicated
background event loop (thread ``taurl-mcp``). Tool calls are awaited from any loop (the
rollout's, or the tools' background loop behind sync `Env.step`) through
`asyncio.wrap_future`, so a slow server blocks no rollout; a caller's cancellation (the
executor's timeout) cancels the request on the MCP loop. Listing tools (env construction)
is synchronous and waits for the first connection.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import json
import os
import re
import sys
import threading
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from taurl.errors import ConfigError, Error
from taurl.tools.mcp_config import MCPServerConfig
from taurl.tools.specs import ToolSpec

T = TypeVar("T")
NAMESPACE_SEP = "__"


class MCPToolError(Error, RuntimeError):
    """An MCP tool call failed: the server reported an error, died, hung or is unavailable."""


class MCPTimeout(MCPToolError, asyncio.TimeoutError):
    """The server did not answer a call within its ``timeout_s`` (receipt status ``timeout``)."""


# ---------------------------------------------------------------------------------------
# The MCP event loop: one daemon thread, where every connection's owner task lives.

_LOOP: dict[str, Any] = {}
_LOOP_LOCK = threading.Lock()


def _mcp_loop() -> asyncio.AbstractEventLoop:
    with _LOOP_LOCK:
        loop = _LOOP.get("loop")
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="taurl-mcp", daemon=True)
            thread.start()
            _LOOP.update(loop=loop, thread=thread)
        return loop


def _submit(coro: Coroutine[Any, Any, T]) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, _mcp_loop())


def _blocking(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    if threading.current_thread() is _LOOP.get("thread"):
        coro.close()
        raise MCPToolError("a blocking MCP call was made on the MCP loop itself; await instead")
    return _submit(coro).result(timeout_s)


class MCPClient:
    """One connection to one MCP server (module docstring: transports, restart policy).

    Counters, for tests and metrics: `starts` (connection attempts; all but the first are
    restarts), `connects` (successful), `transport_failures`, `calls` (sent to the server).
    """

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.starts = self.connects = self.transport_failures = self.calls = 0
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._tools: list[Any] | None = None
        self._closed = False

    # -- public, callable from any thread or loop ---------------------------------------
    def list_tools(self) -> list[Any]:
        """The server's tools (`mcp.types.Tool`), listed once per client; waits for a connection."""
        return _blocking(self._alist(), self.config.connect_timeout_s * 2 + 5)

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """Call `tool`; its result content, rendered (`render_result`). Raises MCPToolError."""
        return await asyncio.wrap_future(_submit(self._acall(tool, arguments)))

    def close(self) -> None:
        """Close the connection (a stdio server is stopped); later calls fail."""
        self._closed = True
        if _LOOP.get("loop") is not None and threading.current_thread() is not _LOOP.get("thread"):
            with contextlib.suppress(Exception):
                _blocking(self._disconnect(), 15.0)

    # -- on the MCP loop ----------------------------------------------------------------
    async def _alist(self) -> list[Any]:
        if self._tools is None:
            client, stop = await self._ensure(), self._stop
            try:
                result = await asyncio.wait_for(client.list_tools(), self.config.connect_timeout_s)
            except Exception as e:
                await self._failed(stop)
                raise MCPToolError(f"MCP server {self.config.name!r} could not list its tools: "
                                   f"{type(e).__name__}: {e}") from None
            self._tools = list(result.tools)
        return self._tools

    async def _acall(self, tool: str, arguments: dict[str, Any]) -> Any:
        client, stop = await self._ensure(), self._stop
        self.calls += 1
        timeout = self.config.timeout_s
        try:
            # the SDK's own timeout too, so a request never outlives its caller on this loop
            result = await asyncio.wait_for(client.call_tool(tool, arguments,
                                                             read_timeout_seconds=timeout + 1.0),
                                            timeout)
        except asyncio.TimeoutError:  # the server is hung or too slow: its state is unknown
            await self._failed(stop)
            raise MCPTimeout(f"MCP server {self.config.name!r} did not answer {tool!r} within "
                             f"{timeout:g} s; the connection was closed and "
                             f"{self._restart_note()}") from None
        except asyncio.CancelledError:  # the caller gave up (its budget): treat the server as hung
            await asyncio.shield(self._failed(stop))
            raise
        except Exception as e:  # noqa: BLE001 — the transport failed: the connection is gone
            await self._failed(stop)
            raise MCPToolError(f"MCP server {self.config.name!r} failed during the call "
                               f"({type(e).__name__}: {str(e)[:300]}); "
                               f"{self._restart_note()}") from None
        text = render_result(result)
        if result.is_error:
            raise MCPToolError(text[:2000] or "the server reported an error without a message")
        return text

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)

    def _restart_note(self) -> str:
        left = self.config.max_restarts - self.restarts
        return (f"it will be restarted on the next call ({left} restart(s) left)" if left > 0
                else "it has no restarts left")

    async def _ensure(self) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._client is not None:
                return self._client
            if self._closed:
                raise MCPToolError(f"MCP server {self.config.name!r}: the client is closed")
            if self.starts > self.config.max_restarts:
                raise MCPToolError(f"MCP server {self.config.name!r} is unavailable: it failed and "
                                   f"its {self.config.max_restarts} restart(s) are spent "
                                   "(max_restarts)")
            self.starts += 1
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[Any] = loop.create_future()
            self._stop = asyncio.Event()
            self._owner = loop.create_task(self._own(ready, self._stop))
            try:
                client = await asyncio.wait_for(asyncio.shield(ready),
                                                self.config.connect_timeout_s)
            except Exception as e:  # noqa: BLE001 — a server that cannot start is a tool error
                self._stop.set()
                # a server stuck in the handshake: cancelling stops its process
                self._owner.cancel()
                self.transport_failures += 1
                raise MCPToolError(f"MCP server {self.config.name!r} could not be started: "
                                   f"{type(e).__name__}: {str(e)[:300]}") from None
            self.connects += 1
            self._client = client
            return client

    async def _own(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        """The owner task: enters and exits the SDK client in one task (anyio requires it)."""
        from mcp import Client  # the optional extra: imported where it is used

        try:
            with contextlib.ExitStack() as files:
                async with Client(self._target(files)) as client:
                    if not ready.done():
                        ready.set_result(client)
                    await stop.wait()
        except BaseException as e:  # noqa: BLE001 — reported through `ready`, or the connection just ends
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else MCPToolError(repr(e)))
        finally:
            if self._stop is stop:
                self._client = None

    def _target(self, stack: contextlib.ExitStack) -> Any:
        if self.config.url:
            return self.config.url
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        cmd = self.config.command
        params = StdioServerParameters(command=cmd[0], args=list(cmd[1:]),
                                       env={**os.environ, **self.config.env}, cwd=self.config.cwd)
        errlog = (stack.enter_context(open(self.config.stderr, "a"))  # noqa: SIM115
                  if self.config.stderr else sys.stderr)
        return stdio_client(params, errlog=errlog)

    async def _failed(self, stop: asyncio.Event | None) -> None:
        """A call on the connection of `stop` failed at the transport: close that connection
        (not a newer one another call has opened meanwhile)."""
        self.transport_failures += 1
        if self._stop is stop:
            await self._disconnect()

    async def _disconnect(self) -> None:
        stop, owner = self._stop, self._owner
        self._client = None
        if stop is not None:
            stop.set()
        if owner is not None and not owner.done():
            try:
                await asyncio.wait_for(asyncio.shield(owner), 10.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 — a stuck teardown is abandoned
                owner.cancel()


def render_result(result: Any) -> str:
    """A `CallToolResult`'s content as observation text: text blocks joined; other blocks
    named; structured content as JSON when there is no text."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '')}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {getattr(block, 'uri', '')}]")
        else:
            parts.append(f"[{kind or type(block).__name__}]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------
# Shared clients and the specs the env declares.

_CLIENTS: dict[str, MCPClient] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(config: MCPServerConfig) -> MCPClient:
    """The process's one client for this server config (opened on first use)."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(config.key())
        if client is None or client._closed:
            client = _CLIENTS[config.key()] = MCPClient(config)
        return client


@atexit.register
def close_all() -> None:
    """Close every shared client (their stdio servers stop). Also runs at exit."""
    with _CLIENTS_LOCK:
        clients = list(_CLIENTS.values())
        _CLIENTS.clear()
    for c in clients:
        c.close()


def tool_scopes(tool: Any, override: Iterable[str] | None = None) -> frozenset[str]:
    """The scopes an MCP tool needs: `override` (the config's) or its annotations read
    with the MCP spec's defaults (module docstring)."""
    if override is not None:
        return frozenset(override)
    a = getattr(tool, "annotations", None)

    def hint(key: str, default: bool) -> bool:
        value = getattr(a, key, None) if a is not None else None
        return default if value is None else bool(value)

    scopes = {"read"} if hint("read_only_hint", False) else {"write"}
    if "write" in scopes and hint("destructive_hint", True):
        scopes.add("destructive")
    if hint("open_world_hint", True):
        scopes.add("network")
    return frozenset(scopes)


def namespaced(server: str, tool: str) -> str:
    """``{server}__{tool}``, with characters a function name may not hold replaced by ``_``."""
    return f"{server}{NAMESPACE_SEP}{re.sub(r'[^A-Za-z0-9_-]', '_', tool)}"[:64]


def mcp_tool_specs(servers: Iterable[MCPServerConfig | Mapping[str, Any]],
                   clients: Mapping[str, MCPClient] | None = None) -> list[ToolSpec]:
    """Connect to each server (shared clients unless given) and list its tools as ToolSpecs.

    Raises ConfigError (every problem) for a server that cannot be listed, a ``tools:``
    name the server does not offer, or two tools whose namespaced names collide.
    """
    if importlib.util.find_spec("mcp") is None:
        raise ConfigError("MCP servers need the MCP SDK, which is not installed: pip install "
                          "'taurl[mcp]'")
    specs: list[ToolSpec] = []
    problems: list[str] = []
    for i, raw in enumerate(servers):
        cfg = MCPServerConfig.from_dict(raw, f"mcp_servers[{i}]")
        client = (clients or {}).get(cfg.name) or shared_client(cfg)
        try:
            listed = client.list_tools()
        except Exception as e:  # noqa: BLE001 — said once, with how to fix it
            problems.append(f"MCP server {cfg.name!r} ({' '.join(cfg.command) or cfg.url}) could "
                            f"not be listed: {type(e).__name__}: {e}. Check that it starts and "
                            "speaks MCP")
            continue
        offered = {t.name: t for t in listed}
        wanted = list(offered) if cfg.tools is None else list(cfg.tools)
        problems += [f"MCP server {cfg.name!r} has no tool {w!r}; it offers {sorted(offered)}"
                     for w in wanted if w not in offered]
        problems += [f"MCP server {cfg.name!r}: scopes given for {k!r}, which it does not offer"
                     for k in cfg.scopes if k not in offered]
        for w in (w for w in wanted if w in offered):
            specs.append(_spec(client, cfg, offered[w]))
    names = [s.name for s in specs]
    problems += [f"two MCP tools are both named {n!r}; rename a server" for n in sorted(set(names))
                 if names.count(n) > 1]
    if problems:
        raise ConfigError(problems)
    return specs


def _spec(client: MCPClient, cfg: MCPServerConfig, tool: Any) -> ToolSpec:
    server_name = tool.name

    async def call(**arguments: Any) -> str:
        return await client.call(server_name, arguments)

    parameters = dict(tool.input_schema or {})
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    parameters.pop("title", None)  # pydantic's titles: noise in every prompt
    parameters["properties"] = {k: ({kk: vv for kk, vv in v.items() if kk != "title"}
                                    if isinstance(v, dict) else v)
                                for k, v in parameters["properties"].items()}
    description = " ".join((tool.description or tool.title or f"the {server_name} tool of MCP "
                                                              f"server {cfg.name}").split())
    return ToolSpec(namespaced(cfg.name, server_name), description, parameters, call, is_async=True,
                    scopes=tool_scopes(tool, cfg.scopes.get(server_name)),
                    cost=float(cfg.cost.get(server_name, 0.0)),
                    # a call may first (re)connect
                    timeout_s=float(cfg.timeout_s + cfg.connect_timeout_s))

