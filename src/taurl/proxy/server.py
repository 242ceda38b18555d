"""The OpenAI-compatible training proxy: any taurl engine behind ``/v1/chat/completions``.

Routes (each episode has its own base URL, ``{root}/rollouts/{episode_id}/v1``, so a call
names its trajectory without any change to the agent):

    POST /rollouts/{id}/v1/chat/completions   messages, tools / tool_calls, stream true|false
    POST /rollouts/{id}/v1/completions        prompt (a string), stream true|false
    POST /rollouts/{id}/v1/responses          the OpenAI Responses API (`taurl.proxy.responses`)
    POST /rollouts/{id}/v1/messages           Anthropic's Messages API (`taurl.proxy.messages`)
    GET|POST /rollouts/{id}/mcp               the episode's MCP endpoint, with tools
                                              (`taurl.proxy.mcp_endpoint`)
    GET  /rollouts/{id}/v1/models             the served policy, as one model
    POST /rollouts/{id}/retriever/search      {"query", "k"}: the episode's retriever (a tool
                                              receipt is recorded for every search)
    GET  /rollouts/{id}/tools                 the tools taurl runs for the agent (MCP servers'),
    POST /rollouts/{id}/tools/call            and one OpenAI tool call through the host gate
                                              (`taurl.proxy.tools`)
    POST /rollouts/{id}/reward                {"reward": float, "components": {...}}
    POST /rollouts/{id}/end                   the agent says the episode is over
    GET  /rollouts/{id}                       what was captured (chains, calls, status)

Any other path answers 404 with the routes served (`taurl.proxy.app`, the HTTP layer).

Episodes are opened by whoever owns them: the agent runner (`taurl.proxy.runner`) opens
each one with its task (`ProxyServer.open`) and pops it when the agent is done. A call to an
id the proxy did not open is refused (404), so a made-up id cannot start an episode of its
own (nor a fresh tool-gate budget); a call after an episode ended or was popped is refused
(409), so an agent that outlived its timeout cannot write into a finished record or open an
orphan one. Only the standalone `taurl proxy` (``open_on_call=True``) opens an episode on
the first call to a new id (any call: a model call, the tools list, a tool call, a search),
with a seed derived from the server's and the id; an id it closed stays closed there too.

Streaming: the engine protocol returns a whole completion, so a streamed answer is sent
as SSE chunks once the completion is sampled. Both forms are built from the same
`Call` record, so streaming never changes what is captured.

Admission (`taurl.proxy.admission`): with an `Admission` policy (the async schedule's
staleness bound), a model call the policy refuses is answered 429 with ``Retry-After``
and counted (`ProxyServer.throttled`); the agent's SDK retries it after that delay.
Without one every call is admitted (the synchronous recipe needs none).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from taurl.data.trajectory import StopReason, ToolReceipt
from taurl.errors import Error
from taurl.policy.protocol import SamplingParams
from taurl.proxy.admission import AdmissionRequest, checked_delay, retry_after_headers
from taurl.proxy.capture import Call, EpisodeCapture, ProxyError, matched_stop
from taurl.proxy.http_thread import ServingThread, serve_in_thread
from taurl.rollout.seeds import episode_seed
from taurl.tools.passages import NO_RESULTS, format_hits


@dataclass
class ProxyLimits:
    """Per-call and per-episode budgets the proxy enforces (the built-in loop's, by name)."""

    max_calls: int = 8  # model calls per episode; the next is refused (the episode is truncated)
    max_action_tokens: int = 96  # cap on a call's max_tokens
    max_context: int = 1536  # prompt + completion
    # forced on every call (training samples at the learner's T); None: the agent's
    temperature: float | None = 1.0
    # forced on every call (a nucleus would bias the learner's ratio); None: the agent's
    top_p: float | None = 1.0


@dataclass
class ProxyEpisode:
    """The server-side state of one episode."""

    episode_id: str
    capture: EpisodeCapture
    seed: int = 0
    engine: Any = None  # a per-episode engine (an expert script), else the server's
    status: str = "open"  # "open" | "ended"
    reward: float | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    # (the call it follows, as index + 1: `ProxyServer.turn_of`; the receipt)
    receipts: list[tuple[int, ToolReceipt]] = field(default_factory=list)
    budget_hit: bool = False
    # the first call the proxy refused for a budget: (stop reason, why) — max_turns (agent.max_calls
    # spent) or context_full (the conversation outgrew the context); the episode is truncated there
    refusal: tuple[str, str] | None = None
    engine_error: str | None = None
    calls: int = 0  # model calls started (each takes the next index: `ProxyServer.call`)
    answered: int = 0  # index + 1 of the call answered last (tools the agent runs follow it)
    tool_call_turns: dict[str, int] = field(default_factory=dict)  # tool call id -> index + 1
    temperature: float | None = None  # the first call's sampling temperature
    top_p: float = 1.0  # the smallest top_p any call sampled with
    gate: Any = None  # the episode's host gate for `tools/call` (budgets per episode)
    # (stop reason, penalty, why): a refusal that truncated it
    gate_stop: tuple[str, float, str] | None = None
    tool_errors: list[tuple[int, str]] = field(default_factory=list)  # (turn_of, error): failures
    # the admission policy let the episode start (its first call, or the runner)
    admitted: bool = False
    throttled: int = 0  # calls answered 429 (admission refused them)
    admission_waits: int = 0  # times the runner waited before starting the agent
    admission_wait_s: float = 0.0
    # Responses API: id -> its conversation
    responses: dict[str, list[dict]] = field(default_factory=dict)


class ProxyServer:
    """The proxy in a background thread (uvicorn on its own event loop), on loopback."""

    def __init__(self, engine: Any, tokenizer: Any, *, limits: ProxyLimits | None = None,
                 retriever: Any = None, max_doc_chars: int | None = 400, tools: Any = None,
                 admission: Any = None, host: str = "127.0.0.1", port: int = 0, seed: int = 0,
                 open_on_call: bool = False):
        self.engine, self.tok, self.limits = engine, tokenizer, limits or ProxyLimits()
        self.retriever, self.max_doc_chars = retriever, max_doc_chars
        self.tools = tools  # taurl.proxy.tools.ProxyTools, or None: no tools/ endpoints
        self.admission = admission  # taurl.proxy.admission.Admission, or None: admit every call
        self.throttled = 0  # 429s answered, over all episodes
        self.host, self.port = host, port
        # an episode a call opens samples with a seed of its own, derived from this and its id
        self.seed = seed
        self.episodes: dict[str, ProxyEpisode] = {}
        # a call to an unknown id opens it (standalone `taurl proxy`), else 404 (module docstring)
        self.open_on_call = open_on_call
        self.closed: set[str] = set()  # ids popped: a later call is refused, never re-opens them
        self.lock = threading.Lock()
        self._serving: ServingThread | None = None
        from taurl.proxy.app import build_app

        self._mcp: tuple[Any, Any] | None = None  # (endpoint, session manager): with tools
        if tools is not None:
            from taurl.proxy.mcp_endpoint import mcp_app

            self._mcp = mcp_app(self)
        self.app = build_app(self, self._mcp[0] if self._mcp else None)

    # -- lifecycle ------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def base_url(self, episode_id: str) -> str:
        """The OpenAI SDK's base URL (Chat Completions, Responses) for one episode."""
        return f"{self.url}/rollouts/{episode_id}/v1"

    def anthropic_base_url(self, episode_id: str) -> str:
        """The `anthropic` SDK's base URL (it adds ``/v1/messages`` itself)."""
        return f"{self.url}/rollouts/{episode_id}"

    def mcp_url(self, episode_id: str) -> str | None:
        """The episode's MCP endpoint (streamable HTTP), or None without tools."""
        return f"{self.url}/rollouts/{episode_id}/mcp" if self._mcp else None

    def start(self) -> ProxyServer:
        self._serving = serve_in_thread(self.app, self.host, self.port, name="taurl-proxy",
                                        what="the proxy", serve=self._serve)
        self.port = self._serving.port
        return self

    async def _serve(self, server: Any, sock: socket.socket) -> None:
        async with contextlib.AsyncExitStack() as stack:
            if self._mcp is not None:  # the MCP endpoint's sessions live on the serving loop
                await stack.enter_async_context(self._mcp[1].run())
            await server.serve(sockets=[sock])

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def open(self, episode_id: str, *, seed: int = 0, engine: Any = None) -> ProxyEpisode:
        """Open `episode_id` (the owner's call: the runner's; a closed id is opened again only
        this way, never by an agent's call)."""
        with self.lock:
            if episode_id in self.episodes:
                raise Error(f"episode {episode_id!r} is already open in the proxy")
            self.closed.discard(episode_id)
            ep = ProxyEpisode(episode_id, EpisodeCapture(self.tok, episode_id), seed=seed,
                              engine=engine)
            self.episodes[episode_id] = ep
            return ep

    def end(self, episode_id: str) -> ProxyEpisode:
        """Mark the episode ended (later calls are refused) and close its chains."""
        with self.lock:
            ep = self.episodes[episode_id]
            if ep.status == "open":
                ep.status = "ended"
                for c in ep.capture.chains:
                    ep.capture.close_chain(c)
            return ep

    def pop(self, episode_id: str) -> ProxyEpisode:
        ep = self.end(episode_id)
        with self.lock:
            del self.episodes[episode_id]
            self.closed.add(episode_id)
        return ep

    def episode(self, episode_id: str, *, create: bool = True) -> ProxyEpisode:
        """The open episode a call names; ProxyError 409 for an ended or popped one, 404 for an
        id nobody opened (unless `open_on_call` and `create`: the standalone proxy opens it)."""
        with self.lock:
            ep = self.episodes.get(episode_id)
            closed = episode_id in self.closed
        if ep is None and not closed:
            if not (create and self.open_on_call):
                raise ProxyError(f"no episode {episode_id!r}: the proxy serves only the episodes "
                                 "its runner opened", 404, "episode_not_found",
                                 {"x-should-retry": "false"})
            ep = self.open(episode_id, seed=episode_seed(self.seed, episode_id))
        if closed or ep.status != "open":
            # the openai SDK retries 409s unless told
            raise ProxyError(f"episode {episode_id!r} has ended; calls after the end are not "
                             "recorded", 409, "episode_ended", {"x-should-retry": "false"})
        return ep

    # -- the model call -------------------------------------------------------------
    def sampling(self, ep: ProxyEpisode, body: dict, prompt_len: int,
                 engine: Any) -> SamplingParams:
        lim = self.limits
        room = min(lim.max_context, engine.max_context) - prompt_len
        if room < 1:
            raise ProxyError(f"the conversation is {prompt_len} tokens; the context limit is "
                             f"{lim.max_context}",
                             400, "context_length_exceeded")
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or lim.max_action_tokens
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        stop_ids, stop_strings = ep.capture.chains[-1].codec.split_stops(stop) if stop else ((), ())
        temp = (lim.temperature if lim.temperature is not None
                else float(body.get("temperature", 1.0)))
        top_p = lim.top_p if lim.top_p is not None else float(body.get("top_p", 1.0))
        ep.top_p = min(ep.top_p, top_p)  # the record says so (`Trajectory.behaviour_logprobs`)
        if ep.temperature is None:
            ep.temperature = temp
        return SamplingParams(temperature=temp, top_p=top_p,
                              max_tokens=max(1, min(int(asked), lim.max_action_tokens, room)),
                              stop=stop_strings, stop_token_ids=stop_ids,
                              seed=(ep.seed * 1_000_003 + ep.calls) % 2**31)

    @staticmethod
    def refuse(ep: ProxyEpisode, reason: StopReason, why: str, code: str) -> ProxyError:
        """The 400 for a call over a budget; the first one is the episode's truncation (its record's
        stop reason, whatever the agent does after it)."""
        if ep.refusal is None:
            ep.refusal = (reason.value, why)
        return ProxyError(why, 400, code)

    def admit(self, ep: ProxyEpisode, engine: Any) -> float | None:
        """None when the admission policy admits `ep`'s next call, else the seconds to wait."""
        if self.admission is None:
            return None
        kind = "call" if ep.admitted else "episode"
        wait = checked_delay(self.admission(AdmissionRequest(ep.episode_id, kind, ep.calls,
                                                             int(getattr(engine, "version", 0)))))
        if wait is None:
            ep.admitted = True
        return wait

    async def call(self, episode_id: str, body: dict, chat: bool) -> Call:
        ep = self.episode(episode_id)
        engine = ep.engine or self.engine
        if (wait := self.admit(ep, engine)) is not None:
            ep.throttled += 1
            with self.lock:
                self.throttled += 1
            raise ProxyError("not admitted now (the pipeline's staleness bound); retry after "
                             f"{wait:.3g} s", 429,
                             "staleness_bound", retry_after_headers(wait))
        if ep.calls >= self.limits.max_calls:
            ep.budget_hit = True
            raise self.refuse(ep, StopReason.MAX_TURNS, f"episode {episode_id!r} used its "
                                                        f"{self.limits.max_calls} "
                              "model calls (agent.max_calls)", "budget_exceeded")
        tools = body.get("tools") or None
        if chat:
            chain, obs = ep.capture.chat_prompt(body.get("messages"), tools)
        else:
            chain, obs = ep.capture.completion_prompt(body.get("prompt"))
        ids = ep.capture.chains[chain].ids
        try:
            sampling = self.sampling(ep, body, len(ids), engine)
        except ProxyError as e:
            ep.capture.retract(chain, obs)
            raise self.refuse(ep, StopReason.CONTEXT_FULL, str(e), e.code) from None
        # this call's index, taken before the await: calls of one episode may run concurrently
        index, ep.calls = ep.calls, ep.calls + 1
        try:
            gen = await engine.generate(list(ids), sampling)
        except Error as e:
            ep.engine_error = f"engine: {e}"
            raise ProxyError(f"the engine failed: {e}", 500, "engine_error") from None
        # the agent went on after a refused call (a shorter history): not truncated there
        ep.refusal = None
        if chat:
            call = ep.capture.chat_result(chain, obs, gen.token_ids, gen.logprobs,
                                          gen.policy_version,
                                          gen.finish_reason, tools is not None, gen.generate_s)
        else:
            call = ep.capture.completion_result(chain, obs, gen.token_ids, gen.logprobs,
                                                gen.policy_version,
                                                gen.finish_reason, gen.generate_s)
        call.index, call.prompt_tokens = index, len(ids) - len(gen.token_ids)
        call.sampled = len(gen.token_ids)
        call.stop_sequence = matched_stop(body.get("stop"), gen.stop_matched,
                                          ep.capture.chains[chain].codec)
        ep.answered = index + 1
        ep.tool_call_turns.update((tc["id"], index + 1) for tc in call.tool_calls)
        return call

    @staticmethod
    def turn_of(ep: ProxyEpisode, tool_call_id: Any = None) -> int:
        """The call (index + 1) a tool run follows: the one that asked for it (by its tool call
        id), else the call answered last. Never the number of calls started: with calls in
        flight concurrently, that names a call whose answer the agent has not seen."""
        if isinstance(tool_call_id, str) and tool_call_id in ep.tool_call_turns:
            return ep.tool_call_turns[tool_call_id]
        return ep.answered

    def search(self, episode_id: str, body: dict) -> dict:
        ep = self.episode(episode_id)
        if self.retriever is None:
            raise ProxyError("this proxy runs no retriever", 404, "not_found")
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ProxyError("'query' must be a non-empty string")
        k = int(body.get("k", 1))
        t0 = time.perf_counter()
        hits = self.retriever.search(query, k)
        text = format_hits(hits, self.max_doc_chars) if hits else NO_RESULTS
        receipt = ToolReceipt("search", {"query": query}, "allowed", "ok",
                              latency_s=time.perf_counter() - t0, output_chars=len(text))
        ep.receipts.append((self.turn_of(ep), receipt))
        return {"text": text,
                "results": [{"title": h.doc.title, "doc_id": h.doc.doc_id} for h in hits]}


    async def tool_call(self, episode_id: str, body: dict) -> dict:
        """One OpenAI tool call through the episode's gate (`taurl.proxy.tools`)."""
        from taurl.proxy.tools import receipt_json

        ep = self.episode(episode_id)
        if self.tools is None:
            raise ProxyError("this proxy runs no tools (agent.tools is not set)", 404, "not_found")
        if ep.gate is None:
            ep.gate = self.tools.new_gate()
        gated = await self.tools.call(body, ep.gate)
        out = gated.outcome
        turn = self.turn_of(ep, body.get("id"))
        if out.receipt is not None:
            ep.receipts.append((turn, out.receipt))
        if out.error:
            ep.tool_errors.append((turn, out.error))
        d = out.decision
        if d is not None and not d.allowed and d.truncate:
            ep.gate_stop = (d.stop_reason, d.penalty, f"{d.rule}: {d.reason}")
            self.end(episode_id)
        return {"message": gated.message, "receipt": receipt_json(gated),
                "episode_ended": ep.gate_stop is not None}
