"""`taurl serve-tinker --model NAME --run-dir DIR --port P`: the Tinker API on loopback.

Point the unmodified ``tinker`` SDK at it (any key with the ``tml-`` prefix is accepted):

    taurl serve-tinker --model runs/demo/checkpoints/v1 --run-dir runs/tinker --port 8765

    import tinker
    service = tinker.ServiceClient(base_url="http://127.0.0.1:8765", api_key="tml-local")
    training = service.create_lora_training_client("runs/demo/checkpoints/v1", rank=8).result()

``--model`` takes anything taurl loads (a HF directory, a registry name, a GGUF file) and may
be repeated; ``--model ALIAS=NAME`` serves NAME under the name clients pass as base_model.
Checkpoints (``tinker://`` paths), ``ledger.sqlite`` (every sampled sequence, token-exact;
``taurl export RUN`` reads it) and ``metrics.jsonl`` go to ``--run-dir`` (docs/tinker.md).
"""

from __future__ import annotations

import argparse
import time

from taurl.errors import ConfigError


def add_serve_tinker_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve-tinker", help="serve the Tinker training API (the tinker SDK's "
                       "base_url) backed by taurl's learner and local engine",
                       description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--model", action="append", required=True, metavar="[ALIAS=]NAME",
                   help="a model to serve: HF directory, registry name or GGUF file (repeatable)")
    p.add_argument("--run-dir", default="runs/tinker",
                   help="where checkpoints, ledger.sqlite and metrics.jsonl go")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    p.add_argument("--port", type=int, default=8765)


def run_serve_tinker_command(args: argparse.Namespace) -> int:
    try:
        import tinker  # noqa: F401
    except ImportError:
        raise ConfigError("serve-tinker needs the tinker SDK (its wire schema): "
                          "pip install 'taurl[tinker]'") from None
    from taurl.policy.sources import model_problems
    from taurl.tinker.models import parse_model_args
    from taurl.tinker.server import TinkerServer

    models = parse_model_args(args.model)
    if problems := [f"--model {n}: {p}" for n, spec in models.items()
                    for p in model_problems(spec)]:
        raise ConfigError(problems)
    server = TinkerServer(models, args.run_dir, host=args.host, port=args.port).start()
    print(f"serving the Tinker API for {list(models)} at {server.url} (run dir {args.run_dir})"
          " — Ctrl-C to stop", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0
