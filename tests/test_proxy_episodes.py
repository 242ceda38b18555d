"""Which episodes the proxy serves, and what each call of one episode is called.

Real HTTP, a real proxy, real `mcp` client; the engine plays scripted replies
(`ReplyEngine`), since what is checked here is the proxy's bookkeeping, not sampling.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("starlette")
pytest.importorskip("mcp")

import httpx  # noqa: E402

from taurl.envs.search import generate_tasks  # noqa: E402
from taurl.policy import build_tokenizer  # noqa: E402
from taurl.proxy.experts import ReplyEngine  # noqa: E402
from taurl.proxy.server import ProxyLimits, ProxyServer  # noqa: E402
from taurl.proxy.tools import ProxyTools  # noqa: E402
from taurl.tools.specs import tool  # noqa: E402

USER = [{"role": "user", "content": "In which country is Lyon?"}]


@pytest.fixture(scope="module")
def tok():
    texts = [t.prompt for t in generate_tasks("train", n=40, seed=0)]
    return build_tokenizer(texts * 2, vocab_size=500)


def echo(text: str) -> str:
    """Echo the text.

    Args:
        text: What to echo.
    """
    return text


def echo_tools() -> ProxyTools:
    return ProxyTools.from_specs([tool(echo)])


def calls(proxy: ProxyServer, eid: str) -> dict[str, int]:
    """The status of each kind of call an agent makes to episode `eid`."""
    root = f"{proxy.url}/rollouts/{eid}"
    one = {"id": "c1", "type": "function",
           "function": {"name": "echo", "arguments": '{"text": "hi"}'}}
    return {"chat": httpx.post(f"{root}/v1/chat/completions", json={"messages": USER}).status_code,
            "messages": httpx.post(f"{root}/v1/messages",
                                   json={"messages": USER, "max_tokens": 8}).status_code,
            "tools": httpx.get(f"{root}/tools").status_code,
            "tool_call": httpx.post(f"{root}/tools/call", json=one).status_code}


def mcp_call(proxy: ProxyServer, eid: str) -> tuple[bool, str]:
    """(is_error, text) of one ``tools/call`` through the episode's MCP endpoint."""
    from mcp import Client

    async def go() -> tuple[bool, str]:
        async with Client(proxy.mcp_url(eid)) as c:
            r = await c.call_tool("echo", {"text": "hi"})
            return bool(r.is_error), r.content[0].text

    return asyncio.run(go())


def test_the_runners_proxy_serves_only_the_episodes_it_opened(tok):
    """A made-up id opens nothing (404: no orphan episode, no fresh gate budget) and a popped
    episode is never re-opened by a late call (409), through every route and MCP."""
    with ProxyServer(ReplyEngine(tok, ["Paris."] * 4), tok, tools=echo_tools()) as proxy:
        proxy.open("run")
        assert calls(proxy, "run") == {"chat": 200, "messages": 200, "tools": 200, "tool_call": 200}
        assert mcp_call(proxy, "run") == (False, "hi")
        ep = proxy.pop("run")
        assert ep.calls == 2 and len(ep.receipts) == 2
        assert calls(proxy, "run") == {"chat": 409, "messages": 409, "tools": 409, "tool_call": 409}
        assert calls(proxy, "made-up") == {"chat": 404, "messages": 404, "tools": 404,
                                           "tool_call": 404}
        failed, why = mcp_call(proxy, "made-up")
        assert failed and "no episode 'made-up'" in why
        failed, why = mcp_call(proxy, "run")
        assert failed and "has ended" in why
        body = httpx.post(f"{proxy.url}/rollouts/made-up/v1/chat/completions",
                          json={"messages": USER}).json()
        assert body["error"]["code"] == "episode_not_found"
        assert proxy.episodes == {} and ep.calls == 2 and len(ep.receipts) == 2  # nothing re-opened


def test_the_standalone_proxy_opens_new_ids_but_never_a_closed_one(tok):
    with ProxyServer(ReplyEngine(tok, ["Paris."] * 4), tok, tools=echo_tools(),
                     open_on_call=True) as proxy:
        assert calls(proxy, "fresh")["chat"] == 200  # `taurl proxy`: a new id is a new episode
        proxy.pop("fresh")
        ended = {"chat": 409, "messages": 409, "tools": 409, "tool_call": 409}
        assert calls(proxy, "fresh") == ended
        assert "fresh" not in proxy.episodes
        proxy.open("fresh")  # only its owner opens a closed id again
        assert calls(proxy, "fresh")["chat"] == 200


class SlowFirst(ReplyEngine):
    """Scripted replies; the first call's answer comes back last (it waits `delay` s), so two
    calls of one episode are in flight together and finish in the other order."""

    def __init__(self, tok, replies, delay: float = 0.6):
        super().__init__(tok, replies)
        self.delay, self.started = delay, 0

    async def generate(self, prompt_ids, sampling):
        self.started += 1
        first = self.started == 1
        out = await super().generate(prompt_ids, sampling)  # the reply is taken in call order
        if first:
            await asyncio.sleep(self.delay)
        return out


def test_concurrent_calls_of_one_episode_get_their_own_ids_indices_and_receipts(tok):
    """Two Responses calls in flight at once: distinct response ids (so previous_response_id
    resolves to the right history), distinct call indices, and the tool the first call asked
    for gets its receipt on the first call's turn, although the second call answered since."""
    from taurl.proxy.runner import episode_records
    from taurl.tools.parsers import tool_call_text

    task = generate_tasks("train", n=1, seed=0)[0]
    fn = {"type": "function", "name": "echo", "description": "Echo the text.",
          "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}
    replies = [tool_call_text("echo", {"text": "hi"}), "Paris.", "Still Paris."]
    limits = ProxyLimits(max_action_tokens=200, max_context=2048)
    with ProxyServer(SlowFirst(tok, replies), tok, limits=limits, tools=echo_tools()) as proxy:
        proxy.open("e")
        url = f"{proxy.url}/rollouts/e/v1/responses"

        async def both() -> tuple[dict, dict]:
            async with httpx.AsyncClient(timeout=30) as c:
                first = asyncio.create_task(c.post(url, json={"input": "A?", "tools": [fn]}))
                await asyncio.sleep(0.2)  # the first is sampling when the second arrives
                second = await c.post(url, json={"input": "B?", "tools": [fn]})
                return (await first).json(), second.json()

        a, b = asyncio.run(both())
        assert a["id"] != b["id"]
        (asked,) = [o for o in a["output"] if o["type"] == "function_call"]
        one = {"id": asked["call_id"], "type": "function",
               "function": {"name": "echo", "arguments": asked["arguments"]}}
        assert httpx.post(f"{proxy.url}/rollouts/e/tools/call", json=one).status_code == 200
        # B's history: its chain is extended, not A's
        r = httpx.post(url, json={"previous_response_id": b["id"], "input": "Sure?", "tools": [fn]})
        assert r.status_code == 200
        ep = proxy.pop("e")
    chains = ep.capture.chains
    assert [[bool(c.tool_calls) for c in ch.calls] for ch in chains] == [[True], [False, False]]
    assert [[c.index for c in ch.calls] for ch in chains] == [[0], [1, 2]]  # one index per call
    trajs = episode_records(ep, task=task, group_id="g", run_id="t", env_name="search-v0",
                            env_version="1", verifier=None, error=None, agent_name="t",
                            answer=None, source="expert")
    (traj,) = trajs  # one record, the two chains its streams, A's turn first
    assert [t.action["kind"] for t in traj.turns] == ["tool_call", "answer", "answer"]
    assert [t.receipt.tool if t.receipt else None for t in traj.turns] == ["echo", None, None]


def test_a_stop_sequence_that_ended_the_call_is_named_in_the_messages_reply(tok, tmp_path):
    """Anthropic's API answers ``stop_reason: "stop_sequence"`` and the sequence itself; the
    real policy samples its first token, and the same call with that token as a stop ends
    there (same seed, same prompt), plain and streamed."""
    anthropic = pytest.importorskip("anthropic")
    from taurl.policy.engine import LocalEngine
    from taurl.policy.model import build_default_policy

    texts = [t.prompt for t in generate_tasks("train", n=60, seed=0)]
    model, ptok = build_default_policy(texts, tmp_path / "p", size="tiny", seed=0)
    limits = ProxyLimits(max_action_tokens=6, max_context=1024, temperature=1.0)

    def ask(**kw):
        with ProxyServer(LocalEngine(model, ptok, seed=0), ptok, limits=limits, seed=3) as proxy:
            proxy.open("e", seed=3)
            c = anthropic.Anthropic(base_url=proxy.anthropic_base_url("e"), api_key="x",
                                    max_retries=0)
            msg = dict(model="m", max_tokens=6, messages=USER, **kw)
            if not kw.pop("stream", False):
                return c.messages.create(**msg), proxy.pop("e")
            with c.messages.stream(**{k: v for k, v in msg.items() if k != "stream"}) as s:
                return s.get_final_message(), proxy.pop("e")

    free, ep = ask()
    assert free.stop_reason in ("end_turn", "max_tokens") and free.stop_sequence is None
    first = ep.capture.chains[0].calls[0]
    sampled = ep.capture.chains[0].segments[first.action_segment].token_ids
    word = ptok.decode(sampled[:1])
    assert len(sampled) > 1 and sampled[0] != ptok.eos_token_id
    two = ptok.decode(sampled[:2])  # a stop string the engine matches as text (not one token)
    assert len(ptok(two, add_special_tokens=False)["input_ids"]) > 1
    for stop, stream in ((word, False), (word, True), (two, False)):
        stopped, _ = ask(stop_sequences=["never-sampled-zzz", stop], stream=stream)
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
