"""The `taurl` command line. Run `taurl --help` or `taurl COMMAND --help`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

from taurl.cli.config_flags import add_config_flags, config_overrides
from taurl.errors import ConfigError, Error
from taurl.monitor.progress import console_logging

EPILOG = """\
examples:
  taurl rollout --run-dir runs/first --episodes 64          # default tiny policy, search env
  taurl rollout --run-dir runs/g --group-size 8 --split holdout --temperature 0.7
  taurl rollout --config configs/rollout.yaml --run-dir runs/cfg
  taurl inspect runs/first --index 3                        # one trajectory, masks shown
  taurl export runs/first --format parquet                  \
# runs/first/exports/trajectories.parquet
  taurl export --merged runs/lora out/model                 \
# the newest policy, LoRA merged: a plain HF dir
  taurl export --merged runs/svc out/m --checkpoint tinker://ID/sampler_weights/v1  # serve-tinker
  taurl envs                                                # registered environments
  taurl demo                                                \
# SFT -> GRPO -> holdout eval -> runs/demo/report.html
  taurl train --config configs/frozenlake.yaml --run-dir runs/fl
  taurl train --import my_pkg.envs --env my-env-v0 --tasks tasks.jsonl --run-dir runs/mine
  taurl train --config configs/demo.yaml --policy.model path/to/hf_model --run-dir runs/hf
  taurl eval runs/demo --trials 5                           \
# holdout evaluation of the run's current policy
  taurl promote runs/demo --candidate v31 --baseline v1     \
# the promotion gate (exit 0 promoted, 3 refused)
  taurl rollback runs/demo                                  \
# the previous promoted version is current again
  taurl models list                                         \
# registry models and converted GGUF files
  taurl train --config configs/real.yaml                    \
# a pretrained 135M model (make demo-real)
"""


# Over 60 lines on purpose: the argparse declaration of every subcommand, one flat list of
# add_argument calls (declarations, no logic).
def build_parser() -> argparse.ArgumentParser:
    from taurl.recipe.config import RolloutRunConfig

    parser = argparse.ArgumentParser(
        prog="taurl", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="taurl: agentic RL on multi-turn, tool-using tasks, with token-exact "
                    "trajectories.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("rollout", help="run episodes of an environment and store the trajectories",
                       description="Run episodes with a policy (a local HF model directory, or the "
                                   "default "
                       "tiny policy built into RUN/checkpoints/v0), token in / token out, and "
                       "append every trajectory to RUN/ledger.sqlite. Options come from --config "
                       "YAML, then flags.")
    p.add_argument("--run-dir", required=True, help="run directory to create or continue")
    p.add_argument("--config", help="YAML file with any of the options below")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_config_flags(p, RolloutRunConfig)

    p = sub.add_parser("export", help="export a run's trajectories to JSONL or Parquet, or a "
                                      "policy (--merged)",
                       description="Write every stored trajectory (or a filtered subset) in the "
                                   "public "
                       "export format (docs/formats.md). With --merged: write RUN's newest "
                       "checkpoint (or the checkpoint RUN/checkpoints/vN), LoRA adapter merged in, "
                       "as a plain Hugging Face directory OUT (docs/lora.md).")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("merged_out", metavar="OUT", nargs="?",
                   help="with --merged: the new model directory")
    p.add_argument("--merged", action="store_true",
                   help="export the policy (adapter merged) to OUT")
    p.add_argument("--checkpoint", metavar="TINKER_PATH",
                   help="with --merged: the `taurl serve-tinker` checkpoint of RUN to export "
                        "(tinker://MODEL/sampler_weights/NAME; docs/tinker.md)")
    p.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    p.add_argument("--out", help="output file (default RUN/exports/trajectories.FORMAT)")
    p.add_argument("--split", help="only this split")
    p.add_argument("--task-id", help="only this task")
    p.add_argument("--min-version", type=int, help="only trajectories whose versions are all >= "
                                                   "this")

    p = sub.add_parser("inspect", help="show one trajectory with its token mask",
                       description="Print one trajectory: identity, reward, stop reason, then "
                                   "every "
                       "segment (prompt / action / observation / template) with its mask; sampled "
                       "text is green (or ⟦wrapped⟧ with --no-color).")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--episode", help="episode_id (default: by --index in insertion order)")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--no-color", action="store_true")

    p = sub.add_parser("envs", help="list registered environments (taurl's, --import'ed and entry "
                                    "points)")
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=[],
                   help="import MODULE first (it registers envs with taurl.envs.register); "
                        "repeatable")
    from taurl.tools.sandbox_cli import add_sandbox_parser

    add_sandbox_parser(sub)
    from taurl.proxy.cli import add_proxy_parser

    add_proxy_parser(sub)
    from taurl.envs.openenv_serve import add_serve_env_parser

    add_serve_env_parser(sub)
    from taurl.tinker.cli import add_serve_tinker_parser

    add_serve_tinker_parser(sub)
    from taurl.recipe.config import TrainConfig

    for name, help_, desc in (
        ("demo", "the main job: demonstrations, SFT, evaluation, GRPO, evaluation, report "
                 "(search-v0)",
         "The recipe with configs/demo.yaml: build a tokenizer and a tiny policy, synthesize "
         "expert demonstrations through the real loop, run SFT, evaluate on validation and "
         "holdout, train with GRPO, evaluate again and write RUN/report.html and RUN/summary.json. "
         "Options come from --config (default configs/demo.yaml when present), then flags. "
         "Re-running the same command resumes an interrupted run."),
        ("train", "the recipe for any registered environment and any local HF model",
         "Run or resume the recipe (tasks -> SFT -> evaluate -> RL updates -> evaluate -> report) "
         "for any registered env (--env; your own with --import MODULE or a taurl.envs entry "
         "point) and any local HF causal LM (--policy.model DIR; default: the env's tiny policy "
         "built from scratch). Tasks come from the env's task source or a JSONL file (--tasks). "
         "Options come from --config, then flags.")):
        p = sub.add_parser(name, help=help_, description=desc)
        p.add_argument("--run-dir", default=f"runs/{name}",
                       help="run directory to create or resume")
        p.add_argument("--config", help="YAML file with any of the options below")
        p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
        p.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=[],
                       help="import MODULE first (it registers envs with taurl.envs.register); "
                            "repeatable")
        add_config_flags(p, TrainConfig)
    p = sub.add_parser("eval", help="evaluate a run's current policy (or a checkpoint) on the "
                                    "holdout split",
                       description="Evaluation with the env's own verifier: k trials per task, "
                                   "success with a "
                       "task-clustered 95% interval, pass@k, tool calls, tokens, invalid and "
                       "truncation rates, safety and cost per episode and per success. TARGET is a "
                       "run directory (its current policy — the newest checkpoint unless "
                       "promotions.jsonl says otherwise — and its config.yaml) or a checkpoint "
                       "directory (evaluated with the env, prompt and budgets recorded in it).")
    p.add_argument("target", metavar="RUN|CHECKPOINT")
    p.add_argument("--config", help="YAML train config (eval_* options, task_options, env_config)")
    p.add_argument("--split", default="holdout", choices=["holdout", "validation"],
                   help="which split")
    p.add_argument("--tasks", type=int, help="holdout tasks")
    p.add_argument("--trials", type=int, help="k trials per task")
    p.add_argument("--temperature", type=float, help="sampling temperature")
    p.add_argument("--no-progress", action="store_true")
    p = sub.add_parser("promote", help="the promotion gate: may a candidate version replace the "
                                       "baseline?",
                       description="Compare two versions of a training run on the same holdout and "
                                   "validation tasks "
                       "and seeds (paired, task-clustered) and decide from the run's promotion: "
                       "thresholds: holdout gain, safety, cost per success, no validation "
                       "regression. Evaluations in RUN/evals are reused; missing ones run with the "
                       "run's eval settings. The decision is appended to RUN/promotions.jsonl. "
                       "Exit code 0: promoted; 3: refused; 1: bad input.")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--candidate", required=True, metavar="vN",
                   help="the version to promote (v3 or 3)")
    p.add_argument("--baseline", metavar="vM", help="the version to beat (default: the current "
                                                    "policy)")
    p.add_argument("--no-progress", action="store_true")
    p = sub.add_parser("models", help="model sources: registry models, GGUF imports, the model "
                                      "cache",
                       description="`model:` takes a local HF directory, a .gguf file, a registry "
                                   "name or a hub id "
                       "(docs/models.md). GGUF files and registry models are converted once into "
                       "plain HF directories in the model cache ($TAURL_HOME/models, default "
                       "~/.cache/taurl/models).")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    msub.add_parser("list", help="registry models and the converted models in the cache")
    q = msub.add_parser("import", help="convert a GGUF file (or a registry model) into the cache "
                                       "now")
    q.add_argument("source", metavar="FILE|NAME", help="a .gguf file or a registry name (taurl "
                                                       "models list)")
    q.add_argument("--name", help="the cache name of a GGUF file (default: its stem in lower case)")
    q.add_argument("--chat-template", help="replace the GGUF's chat template: chatml | "
                                           "chatml-compact (taurl's, "
                   "with a tool-call preamble) or a .jinja file — for templates that ignore tools")
    q = msub.add_parser("info", help="a cached model's provenance (sha256, package, conversion "
                                     "check) and shape")
    q.add_argument("name", metavar="NAME|DIR")
    p = sub.add_parser("rollback", help="make the previous promoted version (or --to vM) current "
                                        "again",
                       description="Append a rollback record to RUN/promotions.jsonl: the previous "
                                   "promoted version "
                       "(or vM) becomes the run's current policy, the one `taurl eval RUN` "
                       "evaluates.")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--to", metavar="vM", help="the version to make current (default: the previous "
                                              "promoted one)")
    return parser


def main(argv: list[str] | None = None) -> int:
    # OpenMP workers that spin while waiting collapse torch's CPU throughput when cores are
    # shared (measured here: the engine fell 2.5x on 2 busy cores), so the command waits
    # passively unless the user chose otherwise. Set here, by the command, and not by
    # ``import taurl``: importing a library leaves the process environment alone. It only
    # takes effect if torch is not loaded yet, as it is not at this point of the command.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args = parser.parse_args(argv)
    # taurl's library code logs; here its lines are shown (above the progress bars)
    console_logging(logging.DEBUG if args.verbose else logging.INFO)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _dispatch(args)
    except Error as e:
        print(f"taurl {args.command}: error: {e}", file=sys.stderr)
        return 1


# Over 60 lines on purpose: the command table: one branch per subcommand, each a few lines of
# argument passing.
def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "sandbox":  # before `commands`: no model libraries needed
        from taurl.tools.sandbox_cli import run_sandbox_command

        return run_sandbox_command(args)
    if args.command == "proxy":
        from taurl.proxy.cli import run_proxy_command

        return run_proxy_command(args)
    if args.command == "serve-tinker":
        from taurl.tinker.cli import run_serve_tinker_command

        return run_serve_tinker_command(args)
    if args.command == "serve-env":
        from taurl.envs.openenv_serve import run_serve_env_command

        return run_serve_env_command(args)
    if args.command == "models":
        return _models(args)
    from taurl.cli import commands

    if args.command == "rollout":
        from taurl.recipe.config import RolloutRunConfig
        from taurl.recipe.validate import load_config

        overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(RolloutRunConfig)}
        cfg = load_config(RolloutRunConfig, path=args.config, overrides=overrides)
        metrics = commands.rollout(cfg, args.run_dir, progress=not args.no_progress)
        _print_metrics(metrics)
        print(f"stored in {args.run_dir}/ledger.sqlite — inspect with `taurl inspect "
              f"{args.run_dir}`")
    elif args.command == "export" and (args.merged or args.merged_out):
        if not (args.merged and args.merged_out):
            raise Error("a policy export is `taurl export --merged RUN_OR_CHECKPOINT OUT`")
        src = _export_merged(args.run_dir, args.merged_out, args.checkpoint)
        print(f"wrote {src} as a plain Hugging Face model to {args.merged_out} "
              "(AutoModelForCausalLM.from_pretrained loads it)")
    elif args.command == "export":
        query = {k: v for k, v in (("split", args.split), ("task_id", args.task_id),
                                   ("min_version", args.min_version)) if v is not None}
        path, n = commands.export(args.run_dir, args.format, args.out, **query)
        print(f"wrote {n} trajectories to {path}")
    elif args.command == "inspect":
        print(commands.inspect_text(args.run_dir, args.episode, args.index,
                                    color=not args.no_color))
    elif args.command == "envs":
        from taurl.envs import import_env_modules, make, registered, spec

        import_env_modules(args.imports)
        for name in registered():
            try:
                env, s = make(name), spec(name)
            except Error as e:
                # one env that cannot be built (a missing extra) does not hide the others
                print(f"{name}  unavailable: {e}")
                continue
            parts = [p for p, on in (("tasks", s.tasks), ("expert", s.expert),
                                     ("verifier", s.verifier)) if on]
            print(f"{name}  version {env.version}  style {env.observation_style}  "
                  f"tools {[t['function']['name'] for t in env.tools]}  has "
                  f"{'+'.join(parts) or '-'}  from {s.source}")
    elif args.command in ("demo", "train"):
        if args.command == "demo":
            # the demo's figures are the same on any x86-64 CPU (taurl.cpu_isa)
            from taurl.cpu_isa import pin_cpu_isa

            pin_cpu_isa()
        from taurl.recipe.config import TrainConfig

        overrides = config_overrides(args, TrainConfig)
        summary = commands.train(args.config, overrides, args.run_dir,
                                 progress=not args.no_progress,
                                 default_config=("configs/demo.yaml" if args.command == "demo"
                                                 else None),
                                 imports=args.imports)
        print(commands.summary_text(summary, args.run_dir))
    elif args.command == "eval":
        result = commands.evaluate(args.target, args.config, split=args.split, tasks=args.tasks,
                                   trials=args.trials,
                                   temperature=args.temperature, progress=not args.no_progress)
        print(json.dumps(result.to_dict(), indent=2))
        print(_safety_cost_line(result), file=sys.stderr)
    elif args.command == "promote":
        decision = commands.promote(args.run_dir, args.candidate, args.baseline,
                                    progress=not args.no_progress)
        print("\n".join([decision.line(), *(f"  {r}" for r in decision.reasons)]))
        print(f"recorded in {args.run_dir}/promotions.jsonl; current policy v{decision.current}")
        return 0 if decision.promoted else 3
    elif args.command == "rollback":
        record = commands.rollback(args.run_dir, args.to)
        print(f"{record.line()}; recorded in {args.run_dir}/promotions.jsonl")
    return 0


def _models(args: argparse.Namespace) -> int:
    from taurl.policy import sources

    if args.models_command == "list":
        for row in sources.list_models():
            state = "converted" if row["converted"] else ("installed" if row.get("installed")
                                                          else "not installed")
            where = row.get("package") or row.get("from") or ""
            print(f"{row['name']}  {row['kind']}  {state}  {where}")
        print(f"cache: {sources.models_home()}")
    elif args.models_command == "import":
        if sources.source_kind(args.source) == "registry":
            if args.name or args.chat_template:
                raise ConfigError(f"--name and --chat-template are for GGUF files; {args.source!r} "
                                  "is a registry model: import its GGUF file (taurl models info "
                                  "NAME shows where) under a new name")
            path = sources.resolve_model(args.source).path
        elif sources.source_kind(args.source) == "gguf":
            path = sources.import_gguf(args.source, name=args.name,
                                       chat_template=args.chat_template)
        else:
            raise ConfigError(f"{args.source!r} is neither a .gguf file nor a registry name "
                              f"({', '.join(sources.REGISTRY)}); a local HF directory needs no "
                              "import")
        print(f"converted into {path}; use it as model: {path.name}")  # a cache name resolves
    else:
        print(json.dumps(sources.model_info(args.name), indent=2))
    return 0


def _safety_cost_line(r) -> str:
    """One readable line of an evaluation: success next to its safety and cost figures."""
    per = lambda x: "-" if x is None else f"{x:.4g}"  # noqa: E731
    return (f"v{r.policy_version} {r.split}: success {r.success:.3f} [{r.ci95[0]:.3f}, "
            f"{r.ci95[1]:.3f}]; safety: violations {r.violation_rate:.3f}, cheats "
            f"{r.cheat_rate:.3f}, gate denials/ep {r.gate_denials_mean:.3g}, tool errors/ep "
            f"{r.tool_errors_mean:.3g}; cost: tokens/ep {r.tokens_mean:.4g}, tool calls/ep "
            f"{r.tool_calls_mean:.3g}, wall s/ep {r.wall_s_mean:.3g}, per success: tokens "
            f"{per(r.tokens_per_success)}, tool calls {per(r.tool_calls_per_success)}, wall s "
            f"{per(r.wall_s_per_success)}")


def _print_metrics(metrics: dict) -> None:
    width = max(len(k) for k in metrics)
    for k, v in metrics.items():
        if isinstance(v, float) and v == 0.0 and "/stop/" in k:
            continue
        print(f"  {k:<{width}}  {v:.4g}" if isinstance(v, float) else f"  {k:<{width}}  {v}")


if __name__ == "__main__":
    raise SystemExit(main())


def _export_merged(source: str, out: str, checkpoint: str | None) -> str:
    """``taurl export --merged``: a taurl checkpoint (RUN or RUN/checkpoints/vN), or a
    ``taurl serve-tinker`` checkpoint (its directory, or RUN with ``--checkpoint tinker://...``)."""
    from taurl.tinker import export as tinker_export

    if checkpoint is not None:
        source = str(tinker_export.checkpoint_directory(source, checkpoint))
    if tinker_export.is_checkpoint(source):
        return str(tinker_export.export_merged(source, out)[0])
    from taurl.policy.export import export_merged

    return str(export_merged(source, out)[0])
