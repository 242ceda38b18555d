"""The recipe's SFT data for an agent: expert replies served to the agent through the proxy.

The demo's policy starts from expert demonstrations run through the real loop; an agent's
starts from the same expert (`taurl.proxy.experts`), run through the *agent* — so SFT sees
exactly the prompts, tool schemas and tool results the agent will send during RL.
Episode ids are ``demo-<i>`` and the expert draws from ``Random(f"{seed}:{i}")``, as for
the built-in demonstrations, so a restarted run reuses what it stored.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from taurl import envs
from taurl.errors import ConfigError
from taurl.proxy.collect import collect_agent
from taurl.proxy.experts import ReplyEngine
from taurl.proxy.runner import AgentConfig, load_callable
from taurl.rollout.episodes import EpisodeSpec


def expert_replies(cfg: Any, tasks: list) -> list[list[str]]:
    """The expert's reply texts for demonstration `i` of `tasks`, drawn from
    ``Random(f"{seed}:{i}")``."""
    agent = AgentConfig.from_dict(cfg.agent)
    expert = load_callable(agent.expert) if agent.expert else envs.spec(cfg.env).tool_expert
    if expert is None:
        raise ConfigError(f"{cfg.env} has no expert in the proxy's wire format: set agent.expert "
                          "to \"module:function\" (task, rng, **expert_options) -> reply texts, or "
                          "register the env with tool_expert=, or use sft: none")
    return [expert(t, random.Random(f"{cfg.seed}:{i}"), **cfg.expert_options)
            for i, t in enumerate(tasks)]


def agent_tokenizer_texts(cfg: Any, tasks: list) -> list[str]:
    """The demonstrations' reply texts, for the default tokenizer: a tool call in JSON is the
    agent's action format, and without merges for it one call costs ~40 tokens instead of ~15
    (the env's own texts never contain it). Empty when the env has no wire-format expert."""
    try:
        return [text for replies in expert_replies(cfg, tasks) for text in replies]
    except ConfigError:
        return []


def agent_demonstrations(r: Any) -> list:
    """Expert demonstrations of `r.plan.demos` through the run's agent (module docstring)."""
    from taurl.monitor.metrics import rollout_metrics
    from taurl.policy.tokenizer import load_tokenizer

    cfg, t0 = r.cfg, time.perf_counter()
    agent = AgentConfig.from_dict(cfg.agent)
    tok = load_tokenizer(r.run.checkpoint(0))
    specs = [EpisodeSpec(f"demo-{i}", t, cfg.seed + i, f"demo:{t.task_id}")
             for i, t in enumerate(r.plan.demos)]
    replies = dict(zip((s.episode_id for s in specs), expert_replies(cfg, r.plan.demos),
                       strict=True))
    rollout = cfg.rollout_config()
    bar = r.bar(len(specs), "demos")
    trajs, stats = asyncio.run(collect_agent(
        None, tok, r.make_env, specs, agent=agent, config=rollout, ledger=r.ledger,
        run_id=r.run.root.name, concurrency=cfg.concurrency, bar=bar, source="expert",
        engine_for=lambda s: ReplyEngine(tok, replies[s.episode_id], rollout.max_context)))
    bar.close()
    m = rollout_metrics(trajs, time.perf_counter() - t0) if trajs else {}
    r.metrics.write(
        0, {"phase": "demos", **stats, **{k.replace("rollout/", "demos/"): v for k, v in m.items()}}
    )
    r.phase_done("demos", time.perf_counter() - t0)
    return [t for t in trajs if t.valid]
