"""`taurl proxy MODEL`: serve a checkpoint behind the OpenAI-compatible training proxy.

Point any agent at ``http://HOST:PORT/rollouts/<episode id>/v1`` (one id per episode; the
`anthropic` SDK at ``.../rollouts/<episode id>``); ``GET /rollouts/<id>`` shows what was
captured, token for token. With ``--mcp CONFIG`` (a YAML or JSON file: ``mcp_servers``,
``allow``, ``scopes``, ``max_calls``, as ``agent.tools``) each episode also gets an MCP
endpoint, ``.../rollouts/<id>/mcp``, serving those servers' tools behind the host gate.
The recipe starts its own proxy for `agent:` runs; this command is for trying an agent
against a policy.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from taurl.errors import ConfigError


def add_proxy_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("proxy", help="serve a policy behind the OpenAI-compatible training proxy",
                       description=__doc__.split("\n\n", 1)[1].strip())
    p.add_argument("model", metavar="MODEL", help="a local HF model directory (e.g. "
                                                  "runs/demo/checkpoints/v1)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--temperature", type=float, default=None,
                   help="force this sampling temperature on every call (default: the agent's)")
    p.add_argument("--max-tokens", type=int, default=256, help="cap on a call's max_tokens")
    p.add_argument("--max-calls", type=int, default=64, help="model calls per episode")
    p.add_argument("--retriever", action="store_true", help="also serve search-v0's retriever per "
                                                            "episode")
    p.add_argument("--mcp", metavar="CONFIG", default=None,
                   help="a YAML/JSON file of MCP servers (mcp_servers, allow, scopes, ...) served "
                        "per episode at /rollouts/<id>/mcp behind the host gate")
    p.add_argument("--seed", type=int, default=0,
                   help="each episode samples with a seed derived from this and its id (distinct "
                        "per episode)")


def mcp_tools(path: str) -> Any:
    """`ProxyTools` of a ``--mcp`` file; ConfigError (with how to fix it) before anything starts."""
    import yaml

    from taurl.proxy.tools import ProxyTools

    try:
        d = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"--mcp {path}: cannot read it ({e}); give a YAML or JSON file with "
                          "mcp_servers") from None
    if isinstance(d, list):  # a bare list of servers
        d = {"mcp_servers": d}
    try:
        return ProxyTools.from_config(d)
    except ConfigError as e:
        raise ConfigError([f"--mcp {path}: {p}" for p in e.problems]) from None


def start_proxy(args: argparse.Namespace) -> Any:
    """The started `ProxyServer` the command serves (its checks first, before any model loads)."""
    from taurl.policy.files import load_policy_meta
    from taurl.policy.local_engine import LocalEngine
    from taurl.policy.model import load_policy, policy_problems
    from taurl.proxy.server import ProxyLimits, ProxyServer

    if problems := policy_problems(args.model):
        raise ConfigError([f"MODEL: {p}" for p in problems])
    tools = mcp_tools(args.mcp) if getattr(args, "mcp", None) else None
    model, tok = load_policy(args.model)
    version = int(load_policy_meta(args.model).get("policy_version", 0))
    retriever = None
    if args.retriever:
        from taurl.envs.search.retriever import shared_retriever

        retriever = shared_retriever()
    limits = ProxyLimits(max_calls=args.max_calls, max_action_tokens=args.max_tokens,
                         max_context=model.config.max_position_embeddings,
                         temperature=args.temperature)
    proxy = ProxyServer(LocalEngine(model, tok, version=version), tok, limits=limits,
                        retriever=retriever,
                        tools=tools, host=args.host, port=args.port, seed=args.seed,
                        open_on_call=True).start()  # each new id an episode: no runner opens them
    mcp = f", MCP at {proxy.url}/rollouts/<episode id>/mcp" if tools is not None else ""
    print(f"serving {args.model} (policy version {version}) at {proxy.url}/rollouts/<episode "
          f"id>/v1{mcp} — Ctrl-C to stop", flush=True)
    return proxy


def run_proxy_command(args: argparse.Namespace) -> int:
    proxy = start_proxy(args)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        proxy.stop()
    return 0
