"""The proxy's HTTP routes (starlette), over one `taurl.proxy.server.ProxyServer`.

Three model APIs share one capture: Chat Completions (and legacy completions) natively,
the Responses API (`taurl.proxy.responses`) and Anthropic's Messages API
(`taurl.proxy.messages`) translated into the chat call they stand for, so budgets, 429
admission and chain rules are one code path. A path the proxy does not serve answers 404
(405 for a wrong method) with a JSON error that lists the routes it does serve.
"""

from __future__ import annotations

import json
from typing import Any

from taurl.errors import Error
from taurl.proxy import messages, responses
from taurl.proxy.capture import ProxyError
from taurl.proxy.wire import MODEL_NAME, _chat_body, _chat_chunks, _completion_body

P = "/rollouts/{episode_id}"
ROUTES = [  # (method, path, what): the table the unknown-route error prints
    ("POST", P + "/v1/chat/completions", "OpenAI Chat Completions"),
    ("POST", P + "/v1/completions", "OpenAI completions (a prompt string)"),
    ("POST", P + responses.PATH, "OpenAI Responses API"),
    ("POST", P + messages.PATH, "Anthropic Messages API (base_url: /rollouts/{episode_id})"),
    ("GET", P + "/v1/models", "the served policy"),
    ("GET|POST|DELETE", P + "/mcp", "the episode's MCP endpoint (streamable HTTP; with tools)"),
    ("GET", P + "/tools", "the tools taurl runs for the agent"),
    ("POST", P + "/tools/call", "one tool call through the host gate"),
    ("POST", P + "/retriever/search", "the episode's retriever"),
    ("POST", P + "/reward", "the episode's reward"),
    ("POST", P + "/end", "the agent ends the episode"),
    ("GET", P, "what was captured"),
]


def routes_served() -> str:
    return "; ".join(f"{m} {p}" for m, p, _ in ROUTES)


# Over 60 lines on purpose: one closure per HTTP route over the same `proxy`, read as the route
# table it is; split apart, each handler would need the server and starlette's types passed in.
def build_app(proxy: Any, mcp_endpoint: Any = None) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def error(e: ProxyError, shape: Any = None) -> JSONResponse:
        body = shape(e) if shape else {"error": {"message": str(e), "type": e.code, "code": e.code}}
        return JSONResponse(body, status_code=e.status, headers=e.headers or None)

    async def read(request: Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ProxyError("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise ProxyError("the request body must be a JSON object")
        return body

    def sse(events: list[tuple[str | None, dict]], done: bool = False) -> StreamingResponse:
        async def gen():
            for name, payload in events:
                yield (f"event: {name}\n" if name else "") + f"data: {json.dumps(payload)}\n\n"
            if done:
                yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def model_call(request: Request, api: str) -> Any:
        """One model call in any of the served formats, captured by `ProxyServer.call`."""
        eid = request.path_params["episode_id"]
        shape = {"responses": responses.error_body, "messages": messages.error_body}.get(api)
        try:
            body = await read(request)
            ep = proxy.episode(eid)
            conversation: list[dict] = []
            if api == "responses":
                chat, conversation = responses.to_chat(body, ep)
            else:
                chat = messages.to_chat(body) if api == "messages" else body
            call = await proxy.call(eid, chat, api != "completions")
        except ProxyError as e:
            return error(e, shape)
        except Error as e:  # e.g. a chat template that cannot extend the stream as a delta
            return error(ProxyError(f"cannot capture this call: {e}", 500, "capture_error"), shape)
        # the call's own index names its reply: concurrent calls of one episode each get theirs
        n = call.index + 1
        stream = bool(body.get("stream"))
        if api == "responses":
            out = responses.reply(call, ep, f"resp_{eid}_{n}", conversation,
                                  body.get("max_output_tokens"))
            return sse(responses.events(out)) if stream else JSONResponse(out)
        if api == "messages":
            out = messages.reply(call, f"msg_{eid}_{n}")
            return sse(messages.events(out)) if stream else JSONResponse(out)
        if api == "chat":
            rid = f"chatcmpl-{eid}-{n}"
            return sse([(None, c) for c in _chat_chunks(rid, call)], True) if stream else \
                JSONResponse(_chat_body(rid, call, call.prompt_tokens))
        out = _completion_body(f"cmpl-{eid}-{n}", call)
        return sse([(None, out)], True) if stream else JSONResponse(out)

    def api_route(api: str) -> Any:
        async def handler(request: Request) -> Any:
            return await model_call(request, api)
        return handler

    async def models(request: Request) -> Any:
        return JSONResponse({"object": "list",
                             "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "taurl"}]})

    async def search(request: Request) -> Any:
        try:
            return JSONResponse(proxy.search(request.path_params["episode_id"],
                                             await read(request)))
        except ProxyError as e:
            return error(e)

    async def tools(request: Request) -> Any:
        try:
            # an agent may list its tools before its first call
            proxy.episode(request.path_params["episode_id"])
            if proxy.tools is None:
                raise ProxyError("this proxy runs no tools (agent.tools is not set)", 404,
                                 "not_found")
        except ProxyError as e:
            return error(e)
        return JSONResponse({"tools": proxy.tools.declarations})

    async def tool_call(request: Request) -> Any:
        try:
            return JSONResponse(await proxy.tool_call(request.path_params["episode_id"],
                                                      await read(request)))
        except ProxyError as e:
            return error(e)

    async def reward(request: Request) -> Any:
        try:
            ep = proxy.episode(request.path_params["episode_id"], create=False)
            body = await read(request)
            r = body.get("reward")
            if isinstance(r, bool) or not isinstance(r, (int, float)):
                raise ProxyError("'reward' must be a number")
            comps = body.get("components") or {"outcome": float(r)}
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                       for v in comps.values()):
                raise ProxyError("'components' maps names to numbers")
            ep.reward, ep.reward_components = float(r), {str(k): float(v) for k, v in comps.items()}
        except ProxyError as e:
            return error(e)
        return JSONResponse({"ok": True})

    async def end(request: Request) -> Any:
        eid = request.path_params["episode_id"]
        if eid not in proxy.episodes:
            return error(ProxyError(f"no episode {eid!r}", 404, "not_found"))
        proxy.end(eid)
        return JSONResponse({"ok": True})

    async def show(request: Request) -> Any:
        ep = proxy.episodes.get(request.path_params["episode_id"])
        if ep is None:
            return error(ProxyError("no such episode", 404, "not_found"))
        return JSONResponse({"episode_id": ep.episode_id, "status": ep.status, "calls": ep.calls,
                             "malformed_calls": ep.capture.malformed_calls, "reward": ep.reward,
                             "chains": [{"reason": c.reason, "kind": c.kind, "segments": [
                                 {"kind": s.kind, "token_ids": list(s.token_ids),
                                  "policy_version": s.policy_version}
                                 for s in c.segments]} for c in ep.capture.chains]})

    async def unknown(request: Request, exc: Exception) -> Any:
        status = getattr(exc, "status_code", 404)
        what = "no route" if status == 404 else f"{request.method} is not served at"
        return error(ProxyError(f"{what} {request.url.path}; the proxy serves: {routes_served()}",
                                status, "unknown_route"))

    mcp = [Route(P + "/mcp", mcp_endpoint)] if mcp_endpoint is not None else []
    return Starlette(routes=[
        Route(P + "/v1/chat/completions", api_route("chat"), methods=["POST"]),
        Route(P + "/v1/completions", api_route("completions"), methods=["POST"]),
        Route(P + responses.PATH, api_route("responses"), methods=["POST"]),
        Route(P + messages.PATH, api_route("messages"), methods=["POST"]),
        Route(P + "/v1/models", models, methods=["GET"]),
        *mcp,
        Route(P + "/retriever/search", search, methods=["POST"]),
        Route(P + "/tools", tools, methods=["GET"]),
        Route(P + "/tools/call", tool_call, methods=["POST"]),
        Route(P + "/reward", reward, methods=["POST"]),
        Route(P + "/end", end, methods=["POST"]),
        Route(P, show, methods=["GET"]),
    ], exception_handlers={404: unknown, 405: unknown})
