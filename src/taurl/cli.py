"""The `taurl` command line. Run `taurl --help` or `taurl COMMAND --help`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import typing

from taurl.errors import Error

EPILOG = """\
examples:
  taurl rollout --run-dir runs/first --episodes 64          # default tiny policy, search env
  taurl rollout --run-dir runs/g --group-size 8 --split holdout --temperature 0.7
  taurl rollout --config configs/rollout.yaml --run-dir runs/cfg
  taurl inspect runs/first --index 3                        # one trajectory, masks shown
  taurl export runs/first --format parquet                  # runs/first/exports/trajectories.parquet
  taurl envs                                                # registered environments
  taurl demo                                                # SFT -> GRPO -> holdout eval -> runs/demo/report.html
  taurl demo --config configs/large.yaml --run-dir runs/large
  taurl eval runs/demo --trials 5                           # holdout evaluation of the newest checkpoint
"""


def _add_config_flags(p: argparse.ArgumentParser, cls: type) -> None:
    """One --flag per config field; the field's comment in config.py is its help."""
    import inspect

    src = inspect.getsource(cls)
    docs = {}
    for line in src.splitlines():
        name, sep, rest = line.strip().partition(":")
        if sep and "#" in rest:
            docs[name.strip()] = rest.split("#", 1)[1].strip()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_ = f"{docs.get(f.name, '')} (default: {default!r})"
        if hint in (int, float, str):
            p.add_argument(flag, type=hint, default=None, help=help_)
        elif f.name == "max_tool_calls":
            p.add_argument(flag, type=int, default=None, help=help_)
        else:
            p.add_argument(flag, type=json.loads, default=None, help=help_ + " — JSON")


def build_parser() -> argparse.ArgumentParser:
    from taurl.config import RolloutRunConfig

    parser = argparse.ArgumentParser(
        prog="taurl", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="taurl: agentic RL on multi-turn, tool-using tasks, with token-exact trajectories.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("rollout", help="run episodes of an environment and store the trajectories",
                       description="Run episodes with a policy (a local HF model directory, or the default "
                       "tiny policy built into RUN/checkpoints/v0), token in / token out, and append every "
                       "trajectory to RUN/ledger.sqlite. Options come from --config YAML, then flags.")
    p.add_argument("--run-dir", required=True, help="run directory to create or continue")
    p.add_argument("--config", help="YAML file with any of the options below")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_config_flags(p, RolloutRunConfig)

    p = sub.add_parser("export", help="export a run's trajectories to JSONL or Parquet",
                       description="Write every stored trajectory (or a filtered subset) in the public "
                       "export format (README: 'Trajectory export').")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    p.add_argument("--out", help="output file (default RUN/exports/trajectories.FORMAT)")
    p.add_argument("--split", help="only this split")
    p.add_argument("--task-id", help="only this task")
    p.add_argument("--min-version", type=int, help="only trajectories whose versions are all >= this")

    p = sub.add_parser("inspect", help="show one trajectory with its token mask",
                       description="Print one trajectory: identity, reward, stop reason, then every "
                       "segment (prompt / action / observation / template) with its mask; sampled text "
                       "is green (or ⟦wrapped⟧ with --no-color).")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--episode", help="episode_id (default: by --index in insertion order)")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--no-color", action="store_true")

    sub.add_parser("envs", help="list registered environments")
    from taurl.tools.sandbox_cli import add_sandbox_parser

    add_sandbox_parser(sub)
    from taurl.pipeline import PipelineConfig

    for name, help_, desc in (
        ("demo", "the main job: demonstrations, SFT, holdout eval, GRPO, holdout eval, report",
         "Build corpus, tokenizer and a tiny policy, synthesize demonstrations, run SFT, evaluate on the "
         "holdout split, train with GRPO, evaluate again and write RUN/report.html and RUN/summary.json. "
         "Options come from --config (default configs/demo.yaml when present), then flags. Re-running the "
         "same command resumes an interrupted run."),
        ("train", "the same pipeline as demo, with your own config (no default config file)",
         "Run or resume the end-to-end pipeline (see `taurl demo --help`) with --config and flags.")):
        p = sub.add_parser(name, help=help_, description=desc)
        p.add_argument("--run-dir", default=f"runs/{name}", help="run directory to create or resume")
        p.add_argument("--config", help="YAML file with any of the options below")
        p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
        _add_config_flags(p, PipelineConfig)
    p = sub.add_parser("eval", help="evaluate a run's latest checkpoint (or a checkpoint) on the holdout split",
                       description="Holdout evaluation with its own verifier: k trials per task, success with a "
                       "95% Wilson interval, pass@k, tool calls, tokens, invalid and truncation rates. TARGET is a "
                       "run directory (its newest checkpoint and its config.yaml) or a checkpoint directory.")
    p.add_argument("target", metavar="RUN|CHECKPOINT")
    p.add_argument("--config", help="YAML pipeline config (eval_* options, families, env_config)")
    p.add_argument("--tasks", type=int, help="holdout tasks")
    p.add_argument("--trials", type=int, help="k trials per task")
    p.add_argument("--temperature", type=float, help="sampling temperature")
    p.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _dispatch(args)
    except Error as e:
        print(f"taurl {args.command}: error: {e}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "sandbox":  # before `commands`: no model libraries needed
        from taurl.tools.sandbox_cli import run_sandbox_command

        return run_sandbox_command(args)
    from taurl import commands

    if args.command == "rollout":
        from taurl.config import RolloutRunConfig, load_config

        overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(RolloutRunConfig)}
        cfg = load_config(RolloutRunConfig, path=args.config, overrides=overrides)
        metrics = commands.rollout(cfg, args.run_dir, progress=not args.no_progress)
        _print_metrics(metrics)
        print(f"stored in {args.run_dir}/ledger.sqlite — inspect with `taurl inspect {args.run_dir}`")
    elif args.command == "export":
        query = {k: v for k, v in (("split", args.split), ("task_id", args.task_id),
                                   ("min_version", args.min_version)) if v is not None}
        path, n = commands.export(args.run_dir, args.format, args.out, **query)
        print(f"wrote {n} trajectories to {path}")
    elif args.command == "inspect":
        print(commands.inspect_text(args.run_dir, args.episode, args.index, color=not args.no_color))
    elif args.command == "envs":
        from taurl.envs import make, registered

        for name in registered():
            env = make(name)
            print(f"{name}  version {env.version}  style {env.observation_style}  "
                  f"tools {[t['function']['name'] for t in env.tools]}")
    elif args.command in ("demo", "train"):
        from taurl.pipeline import PipelineConfig

        overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(PipelineConfig)}
        summary = commands.train(args.config, overrides, args.run_dir, progress=not args.no_progress,
                                 default_config="configs/demo.yaml" if args.command == "demo" else None)
        print(commands.summary_text(summary, args.run_dir))
    elif args.command == "eval":
        result = commands.evaluate(args.target, args.config, tasks=args.tasks, trials=args.trials,
                                   temperature=args.temperature, progress=not args.no_progress)
        print(json.dumps(result.to_dict(), indent=2))
    return 0


def _print_metrics(metrics: dict) -> None:
    width = max(len(k) for k in metrics)
    for k, v in metrics.items():
        if isinstance(v, float) and v == 0.0 and "/stop/" in k:
            continue
        print(f"  {k:<{width}}  {v:.4g}" if isinstance(v, float) else f"  {k:<{width}}  {v}")


if __name__ == "__main__":
    raise SystemExit(main())
