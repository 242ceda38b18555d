"""The HTTP routes of the Tinker API (Starlette), as the ``tinker`` SDK 0.38.0 calls them.

Requests are parsed with the SDK's own request models (``tinker.types``), so a field the SDK
sends is read the way the SDK means it. Answers: a future's id for work (its result through
``/api/v1/retrieve_future``), the response model's JSON for the rest; HTTP 400
``{"detail": ...}`` for a body that does not parse or a direct request the server refuses,
404 for unknown ids, 410 for a finished session's heartbeat. The REST listing of training
runs and checkpoints is `taurl.tinker.rest`. Any ``X-API-Key`` is accepted:
the server is meant for loopback (`taurl.tinker.server`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from taurl.tinker import rest, wire
from taurl.tinker.futures import Payload
from taurl.tinker.models import RequestError, UnknownId
from taurl.tinker.service import TinkerService
from taurl.tinker.sessions import SessionFinished

API = "/api/v1"
Handler = Callable[[Request], Awaitable[Response]]


class BadRequest(Exception):
    """A body that does not parse (HTTP 400)."""


def _types() -> Any:
    from tinker import types

    return types


async def _parse(request: Request, model: str) -> Any:
    """The JSON body as the SDK's request model `model` (e.g. ``CreateModelRequest``)."""
    import pydantic

    try:
        data = json.loads(await request.body() or b"{}")
        return getattr(_types(), model).model_validate(data)
    except (ValueError, pydantic.ValidationError) as e:
        raise BadRequest(f"the body is not a valid {model}: {e}") from None


def _errors(fn: Handler) -> Handler:
    async def handler(request: Request) -> Response:
        try:
            return await fn(request)
        except (BadRequest, wire.WireError, RequestError) as e:
            return JSONResponse({"detail": str(e)},
                                status_code=404 if isinstance(e, UnknownId) else 400)
        except SessionFinished as e:
            return JSONResponse({"detail": f"session {e} has finished"}, status_code=410)
    return handler


def build_app(service: TinkerService) -> Starlette:
    """The routes, bound to `service`."""

    def future_route(model: str | None, start: Callable[[Any], dict[str, Any]]) -> Handler:
        """A POST that starts work: replayed for a repeated ``X-Idempotency-Key``."""
        async def handler(request: Request) -> Response:
            key = request.headers.get("x-idempotency-key")
            if (answer := service.futures.replay(request.url.path, key)) is not None:
                return JSONResponse(answer)
            if model is None:  # forward_backward: protobuf, maybe zstd
                body = wire.decompress(await request.body(),
                                       request.headers.get("content-encoding"))
                req: Any = wire.decode_forward_backward(body)
            else:
                req = await _parse(request, model)
            answer = start(req)
            service.futures.remember(request.url.path, key, answer)
            return JSONResponse(answer)
        return _errors(handler)

    def json_route(model: str, answer: Callable[[Any], Any]) -> Handler:
        async def handler(request: Request) -> Response:
            return JSONResponse(answer(await _parse(request, model)))
        return _errors(handler)

    async def retrieve(request: Request) -> Response:
        req = await _parse(request, "FutureRetrieveRequest")
        if service.futures.get(req.request_id) is None:
            raise UnknownId(f"unknown request_id {req.request_id!r}")
        payload = await service.futures.wait(req.request_id)
        if payload is None:
            return JSONResponse(wire.try_again(req.request_id), status_code=408)
        return Response(payload.body, media_type=payload.media_type)

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def capabilities(_: Request) -> Response:
        return JSONResponse(service.capabilities())

    async def client_config(_: Request) -> Response:
        return JSONResponse(service.client_config)

    async def dynamic_config(_: Request) -> Response:
        return JSONResponse({"refresh_interval_sec": 300, "sample_cancel_enabled": False})

    async def create_session(request: Request) -> Response:
        req = await _parse(request, "CreateSessionRequest")
        session = service.registry.new_session(req.sdk_version)
        return JSONResponse({"type": "create_session", "session_id": session.session_id})

    async def heartbeat(request: Request) -> Response:
        req = await _parse(request, "SessionHeartbeatRequest")
        service.registry.heartbeat(req.session_id)
        return JSONResponse({"type": "session_heartbeat"})

    async def finish(request: Request) -> Response:
        body = json.loads(await request.body() or b"{}")
        service.registry.finish(request.path_params["session_id"],
                                (body.get("reason") or {}).get("type", "success"))
        return JSONResponse(None)

    async def sampler(request: Request) -> Response:
        return JSONResponse(service.get_sampler(request.path_params["sampler_id"]))

    def page(request: Request, default_limit: int) -> tuple[int, int]:
        try:
            limit = int(request.query_params.get("limit", default_limit))
            offset = int(request.query_params.get("offset", 0))
        except ValueError:
            raise BadRequest("limit and offset must be integers") from None
        if limit < 0 or offset < 0:
            raise BadRequest("limit and offset must be >= 0")
        return limit, offset

    async def training_runs(request: Request) -> Response:
        return JSONResponse(rest.training_runs(service.run_dir, dict(service.registry.models),
                                               *page(request, 20)))

    async def training_run(request: Request) -> Response:
        return JSONResponse(rest.training_run(service.run_dir, request.path_params["run_id"],
                                              dict(service.registry.models)))

    async def run_checkpoints(request: Request) -> Response:
        return JSONResponse(rest.checkpoints(service.run_dir, request.path_params["run_id"],
                                             dict(service.registry.models)))

    async def user_checkpoints(request: Request) -> Response:
        return JSONResponse(rest.user_checkpoints(service.run_dir, *page(request, 100)))

    async def accepted(_: Request) -> Response:
        return JSONResponse({"status": "accepted"})

    async def nothing(_: Request) -> Response:
        return JSONResponse(None)

    routes = [
        Route(f"{API}/healthz", _errors(health), methods=["GET"]),
        Route(f"{API}/get_server_capabilities", _errors(capabilities), methods=["GET"]),
        Route(f"{API}/client/config", _errors(client_config), methods=["POST"]),
        Route(f"{API}/client/dynamic_config", _errors(dynamic_config), methods=["POST"]),
        Route(f"{API}/create_session", _errors(create_session), methods=["POST"]),
        Route(f"{API}/session_heartbeat", _errors(heartbeat), methods=["POST"]),
        Route(f"{API}/sessions/{{session_id}}/finish", _errors(finish), methods=["POST"]),
        Route(f"{API}/create_model", future_route("CreateModelRequest", service.create_model),
              methods=["POST"]),
        Route(f"{API}/get_info", json_route("GetInfoRequest", service.get_info),
              methods=["POST"]),
        Route(f"{API}/forward_backward", future_route(None, service.forward_backward),
              methods=["POST"]),
        Route(f"{API}/optim_step", future_route("OptimStepRequest", service.optim_step),
              methods=["POST"]),
        Route(f"{API}/save_weights", future_route(
            "SaveWeightsRequest", lambda r: service.save(r, sampler=False)), methods=["POST"]),
        Route(f"{API}/save_weights_for_sampler", future_route(
            "SaveWeightsForSamplerRequest", lambda r: service.save(r, sampler=True)),
            methods=["POST"]),
        Route(f"{API}/load_weights", future_route("LoadWeightsRequest", service.load),
              methods=["POST"]),
        Route(f"{API}/create_sampling_session", json_route(
            "CreateSamplingSessionRequest", service.create_sampling_session), methods=["POST"]),
        Route(f"{API}/samplers/{{sampler_id:path}}", _errors(sampler), methods=["GET"]),
        Route(f"{API}/asample", future_route("SampleRequest", service.asample),
              methods=["POST"]),
        Route(f"{API}/retrieve_future", _errors(retrieve), methods=["POST"]),
        Route(f"{API}/training_runs", _errors(training_runs), methods=["GET"]),
        Route(f"{API}/training_runs/{{run_id}}", _errors(training_run), methods=["GET"]),
        Route(f"{API}/training_runs/{{run_id}}/checkpoints", _errors(run_checkpoints),
              methods=["GET"]),
        Route(f"{API}/checkpoints", _errors(user_checkpoints), methods=["GET"]),
        Route(f"{API}/telemetry", _errors(accepted), methods=["POST"]),
        Route(f"{API}/cancel_future", _errors(nothing), methods=["POST"]),
    ]
    return Starlette(routes=routes)


__all__ = ["build_app", "Payload"]
