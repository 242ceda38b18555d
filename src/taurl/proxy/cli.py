"""`taurl proxy MODEL`: serve a checkpoint behind the OpenAI-compatible training proxy.

Point any agent at ``http://HOST:PORT/rollouts/<episode id>/v1`` (one id per episode);
``GET /rollouts/<id>`` shows what was captured, token for token. The recipe starts its
own proxy for `agent:` runs; this command is for trying an agent against a policy.
"""

from __future__ import annotations

import argparse
import time

from taurl.errors import ConfigError


def add_proxy_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("proxy", help="serve a policy behind the OpenAI-compatible training proxy",
                       description=__doc__.split("\n\n", 1)[1].strip())
    p.add_argument("model", metavar="MODEL", help="a local HF model directory (e.g. runs/demo/checkpoints/v1)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--temperature", type=float, default=None,
                   help="force this sampling temperature on every call (default: the agent's)")
    p.add_argument("--max-tokens", type=int, default=256, help="cap on a call's max_tokens")
    p.add_argument("--max-calls", type=int, default=64, help="model calls per episode")
    p.add_argument("--retriever", action="store_true", help="also serve search-v0's retriever per episode")
    p.add_argument("--seed", type=int, default=0,
                   help="each episode samples with a seed derived from this and its id (distinct per episode)")


def run_proxy_command(args: argparse.Namespace) -> int:
    from taurl.policy.local_engine import LocalEngine
    from taurl.policy.model import load_policy, load_policy_meta, policy_problems
    from taurl.proxy.server import ProxyLimits, ProxyServer

    if problems := policy_problems(args.model):
        raise ConfigError([f"MODEL: {p}" for p in problems])
    model, tok = load_policy(args.model)
    version = int(load_policy_meta(args.model).get("policy_version", 0))
    retriever = None
    if args.retriever:
        from taurl.envs.search.retriever import shared_retriever

        retriever = shared_retriever()
    limits = ProxyLimits(max_calls=args.max_calls, max_action_tokens=args.max_tokens,
                         max_context=model.config.max_position_embeddings, temperature=args.temperature)
    proxy = ProxyServer(LocalEngine(model, tok, version=version), tok, limits=limits, retriever=retriever,
                        host=args.host, port=args.port, seed=args.seed).start()
    print(f"serving {args.model} (policy version {version}) at {proxy.url}/rollouts/<episode id>/v1 "
          "— Ctrl-C to stop", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        proxy.stop()
    return 0
