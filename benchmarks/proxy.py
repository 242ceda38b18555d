"""The training proxy's overhead per call, vs calling the engine directly.

The same requests both ways, one run: a conversation of `--turns` calls (each appends the
reply and a tool result), repeated `--episodes` times, sequentially (latency, not
throughput). Two engines:

* `local`: the default tiny policy in a LocalEngine (max_tokens 16) — the ratio a user sees;
* `echo`: an engine that returns 16 fixed ids at once — the proxy's own cost in ms
  (HTTP + JSON + chat-template rendering and delta encoding + tool-call parsing).

Direct calls render the chat once per call and encode it (what a caller without the
proxy's incremental stream would do); proxied calls go through the official openai SDK.

    .venv/bin/python benchmarks/proxy.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

from openai import DefaultHttpxClient, OpenAI

from taurl import envs
from taurl.envs.search import build_corpus, generate_tasks
from taurl.policy.engine import Generation, LocalEngine, SamplingParams
from taurl.policy.model import build_default_policy
from taurl.proxy.server import ProxyLimits, ProxyServer
from taurl.rollout.loop import ChatCodec

TOOLS = [envs.make("search-v0").tools[0]]


class EchoEngine:
    """Returns the same 16 ids at once: no model cost, so only the proxy's cost remains."""

    version, max_context = 0, 4096

    def __init__(self, ids: list[int]):
        self.ids = ids

    async def generate(self, prompt_ids, sampling: SamplingParams) -> Generation:
        return Generation(list(self.ids), [-1.0] * len(self.ids), "length", 0)


def conversation(prompt: str, turns: int, reply: str) -> list[list[dict]]:
    msgs, out = [{"role": "user", "content": prompt}], []
    for t in range(turns):
        out.append(list(msgs))
        msgs += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": f"tool result {t}: Lyon"},
        ]
    return out


def direct(engine, tok, prompts, episodes: int) -> list[float]:
    codec = ChatCodec(tok, TOOLS)
    sampling = SamplingParams(max_tokens=16, seed=0)

    async def run() -> list[float]:
        times = []
        for _ in range(episodes):
            for msgs in prompts:
                t0 = time.perf_counter()
                ids = codec.encode(codec.render(msgs, add_generation_prompt=True))
                await engine.generate(ids, sampling)
                times.append(time.perf_counter() - t0)
        return times

    return asyncio.run(run())


def proxied(engine, tok, turns: int, episodes: int, prompt: str) -> list[float]:
    http = DefaultHttpxClient()
    times = []
    with ProxyServer(
        engine, tok, limits=ProxyLimits(max_calls=turns, max_action_tokens=16, max_context=4096)
    ) as p:
        for e in range(episodes):
            p.open(f"b{e}")
            c = OpenAI(base_url=p.base_url(f"b{e}"), api_key="x", http_client=http, max_retries=0)
            msgs = [{"role": "user", "content": prompt}]
            for t in range(turns):
                t0 = time.perf_counter()
                r = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=16)
                times.append(time.perf_counter() - t0)
                msgs += [r.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"tool result {t}: Lyon"}]
            p.pop(f"b{e}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--turns", type=int, default=4)
    args = ap.parse_args()
    texts = [d.text for d in build_corpus()[::40]] + [
        t.prompt for t in generate_tasks("train", n=300, seed=0)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        model, tok = build_default_policy(texts, tmp, size="tiny", seed=0)
    prompt = generate_tasks("train", n=1, seed=0)[0].prompt
    reply = tok.decode(tok("Lyon is in France, I think, more or less.")["input_ids"][:16])
    prompts = conversation(prompt, args.turns, reply)
    out = {}
    for name, engine in (
        ("echo", EchoEngine(tok("Lyon is in France, I think.")["input_ids"][:16] * 2)),
        ("local", LocalEngine(model, tok, seed=0)),
    ):
        d = direct(engine, tok, prompts, args.episodes)
        p = proxied(engine, tok, args.turns, args.episodes, prompt)
        md, mp_ = statistics.median(d), statistics.median(p)
        out[name] = {
            "calls": len(d),
            "direct_ms_median": 1e3 * md,
            "proxy_ms_median": 1e3 * mp_,
            "overhead_ms_median": 1e3 * (mp_ - md),
            "ratio_median": mp_ / md,
            "direct_ms_mean": 1e3 * statistics.mean(d),
            "proxy_ms_mean": 1e3 * statistics.mean(p),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
