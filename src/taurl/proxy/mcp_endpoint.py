"""Each episode's MCP endpoint: ``/rollouts/{id}/mcp`` (streamable HTTP, the `mcp` SDK's server).

An agent framework's own MCP client (the Agents SDK's ``MCPServerStreamableHttp``,
LangGraph's MCP adapters, pydantic-ai's ``MCPServerStreamableHTTP``) points at its
episode's URL and sees the tools of the MCP servers the config attaches
(`taurl.proxy.tools.ProxyTools`: ``agent.tools``, or ``taurl proxy --mcp CONFIG``) under
their namespaced names (``{server}__{tool}``). Every ``tools/call`` goes through the
episode's host gate exactly as ``POST /rollouts/{id}/tools/call`` does
(`ProxyServer.tool_call`): a receipt in the trajectory for each call, allowed or denied; a
denied call (a forbidden scope, a tool outside the allow-list, a spent budget) never
reaches the server and comes back as an ``isError`` result with the gate's reason; a
refusal whose rule truncates ends the episode there.

``tools/list`` answers before the episode's first model call (an agent lists its tools
first): it opens the episode like any call to an unknown id of the standalone proxy,
counts no model call and starts no chain. The server is stateless (no MCP session
outlives a request), so the episode id in the path is all the state a request needs.
"""

from __future__ import annotations

import itertools
from typing import Any

from taurl.proxy.capture import ProxyError


def mcp_app(proxy: Any) -> tuple[Any, Any]:
    """(the ASGI app to route at ``/rollouts/{episode_id}/mcp``, its session manager, whose
    ``run()`` must be entered on the serving loop)."""
    import mcp.types as types
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    ids = itertools.count()

    def episode_id(ctx: Any) -> str:
        request = getattr(ctx, "request", None)
        eid = getattr(request, "path_params", {}).get("episode_id") if request is not None else None
        if not eid:
            raise ProxyError("an MCP request without its episode (/rollouts/{id}/mcp)")
        return eid

    async def list_tools(ctx: Any, params: Any) -> Any:
        try:
            proxy.episode(episode_id(ctx))  # 409 after the episode ended, 404 for an id not opened
        except ProxyError as e:  # a JSON-RPC error to the client, not a server fault
            return types.ErrorData(code=types.INVALID_REQUEST, message=str(e))
        return types.ListToolsResult(tools=[
            types.Tool(name=s.name, description=s.description, input_schema=s.parameters,
                       annotations=types.ToolAnnotations(read_only_hint=s.scopes <= {"read"},
                                                         open_world_hint="network" in s.scopes))
            for s in proxy.tools.toolbox.specs.values()])

    async def call_tool(ctx: Any, params: Any) -> Any:
        eid = episode_id(ctx)
        call = {"id": f"mcp_{next(ids)}", "type": "function",
                "function": {"name": params.name, "arguments": dict(params.arguments or {})}}
        try:
            result = await proxy.tool_call(eid, call)
        except ProxyError as e:
            return types.CallToolResult(content=[types.TextContent(type="text", text=str(e))],
                                        is_error=True)
        receipt = result["receipt"]
        failed = receipt is None or receipt["status"] != "ok"
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=result["message"]["content"])],
            is_error=failed,
        )

    server = Server("taurl-proxy", on_list_tools=list_tools, on_call_tool=call_tool)
    manager = StreamableHTTPSessionManager(server, stateless=True, json_response=True)

    return _Endpoint(manager), manager


class _Endpoint:
    """An ASGI app (a class: Starlette routes a plain function as a request handler instead)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.manager.handle_request(scope, receive, send)
