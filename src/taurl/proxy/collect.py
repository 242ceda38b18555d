"""`collect` for agents: the recipe's episodes run by a user's agent through the proxy.

Same contract as `taurl.rollout.episodes.collect` (deterministic ids, reuse from the ledger,
append at once, failures counted): the proxy starts on loopback for the batch, each
episode's agent gets its own base URL, and each episode's record is appended: one record
whose token streams are the chains the proxy captured (`taurl.data.streams`), trained as one
episode with one advantage (`taurl.train.chains`). `all_chains` is kept for its callers: the
records are one per episode either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from taurl.data.ledger import Ledger
from taurl.data.trajectory import POLICY_SOURCE, StopReason, Trajectory
from taurl.proxy.runner import (
    AgentConfig,
    cwd_on_path,
    env_retriever,
    load_callable,
    proxy_limits,
    run_agent_episode,
)
from taurl.proxy.server import ProxyServer
from taurl.rollout.runner import close_round, stored_episodes

log = logging.getLogger("taurl.proxy")


# Over 60 lines on purpose: starts the proxy, runs each agent episode through it and stores its
# records, with its failure accounting; one body so the episode's life (open, run, capture,
# close) reads in order.
async def collect_agent(engine: Any, tokenizer: Any, make_env: Callable[[], Any],
                        specs: Sequence[Any], *,
                        agent: dict[str, Any] | AgentConfig, config: Any, ledger: Ledger,
                        run_id: str,
                        concurrency: int = 64, bar: Any = None, on_stored: Callable | None = None,
                        admission: Any = None,
                        all_chains: bool = True, engine_for: Callable[[Any], Any] | None = None,
                        source: str = POLICY_SOURCE, verifier: Any = None
                        ) -> tuple[list[Trajectory], dict[str, float]]:
    """`taurl.rollout.episodes.collect` with `agent` acting (module docstring). engine_for(spec):
    a per-episode engine (expert demonstrations), else `engine` serves every call.
    admission: the async schedule's `taurl.proxy.admission.Admission` (None: admit all)."""
    agent = agent if isinstance(agent, AgentConfig) else AgentConfig.from_dict(agent)
    for name in ("httpx", "httpx2"):  # an in-process agent's HTTP client logs every call at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    cwd_on_path()
    fn = load_callable(agent.callable) if agent.callable else None
    env, retriever = env_retriever(make_env)
    if verifier is None:
        from taurl import envs

        verifier = envs.spec(env.name).make_verifier()
    # checked to be this run's
    out = {e: [t] for e, t in stored_episodes(ledger, specs, None).items()}
    reused = set(out)
    failed: list[str] = []
    sem = asyncio.Semaphore(concurrency)
    tools = None
    if agent.tools:  # MCP servers' tools, called by the agent through taurl's gate
        from taurl.proxy.tools import ProxyTools

        tools = ProxyTools.from_config(agent.tools)
    proxy = ProxyServer(engine, tokenizer, limits=proxy_limits(agent, config), retriever=retriever,
                        max_doc_chars=getattr(env, "max_doc_chars", 400), tools=tools,
                        admission=admission)

    async def one(s: Any) -> None:
        async with sem:
            try:
                trajs = await run_agent_episode(proxy, agent, fn, s, run_id=run_id,
                                                env_name=env.name,
                                                env_version=env.version, verifier=verifier,
                                                engine=engine_for(s) if engine_for else None,
                                                source=source)
            except Exception as e:  # noqa: BLE001 — counted and logged, never fatal
                failed.append(f"{s.episode_id}: {type(e).__name__}: {e}")
                return
        if on_stored is not None:
            on_stored("episode_finished", trajs[-1])
        report = ledger.append_many([t for t in trajs if t.episode_id not in ledger])
        if report.rejected:
            failed.extend(f"{r.episode_id}: [{r.rule}] {r.detail}" for r in report.rejected)
            return
        out[s.episode_id] = trajs
        if bar is not None:
            bar.update(1)
        if on_stored is not None:
            on_stored("episode_stored", trajs[-1])

    t0 = time.perf_counter()
    if bar is not None:
        bar.update(len(reused))
    with proxy:
        await asyncio.gather(*(one(s) for s in specs if s.episode_id not in out))
    # no record from any episode run: the run stops with the first cause (taurl.rollout.runner)
    stats = close_round(specs, out, failed, reused, what="agent episode")
    finals = [out[s.episode_id][-1] for s in specs if s.episode_id in out]
    stats = {**stats,
             "rollout/agent_errors": float(sum(t.stop_reason == StopReason.ERROR for t in finals)),
             "rollout/chains_per_episode": sum(t.num_streams for t in finals) / max(1, len(finals)),
             "rollout/malformed_tool_calls":
                 float(sum(t.metadata.get("malformed_calls", 0) for t in finals)),
             "rollout/agent_tool_errors": float(sum(t.num_errors for t in finals)),
             "rollout/throttled_calls": float(proxy.throttled),
             "rollout/admission_waits":
                 float(sum(t.metadata.get("admission_waits", 0) for t in finals)),
             "rollout/admission_wait_s":
                 float(sum(t.metadata.get("admission_wait_s", 0.0) for t in finals)),
             "time/agent_collect_s": time.perf_counter() - t0}
    if all_chains:
        return [t for s in specs if s.episode_id in out for t in out[s.episode_id]], stats
    return finals, stats
