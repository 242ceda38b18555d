"""What the `taurl` commands do, as plain functions (the CLI only parses arguments)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taurl import envs
from taurl.data.atomic import atomic_write_text
from taurl.data.runs import RunDir
from taurl.errors import Error
from taurl.monitor.progress import phase_bar
from taurl.recipe.config import ROLLOUT_BUDGETS, RolloutRunConfig
from taurl.recipe.validate import dump_config, import_modules

log = logging.getLogger("taurl")


def ensure_policy(run: RunDir, cfg: RolloutRunConfig):
    """Load cfg.model, or the run's latest checkpoint, or build the env's default policy as v0."""
    from taurl.policy.model import build_default_policy, load_policy
    from taurl.train.default_policy import GENERIC_EXPERT_TASKS, default_policy_texts

    if cfg.model:
        from taurl.policy.sources import resolve_model

        return load_policy(resolve_model(cfg.model).path)
    latest = run.latest_checkpoint()
    if latest is not None:
        return load_policy(latest)
    spec = envs.spec(cfg.env)
    # as many training tasks as the generic text collection steps (an env may have few)
    train_tasks = (envs.make_tasks(cfg.env, "train", n=GENERIC_EXPERT_TASKS, seed=cfg.seed,
                                   env_config=cfg.env_config, **cfg.task_options)
                   if spec.tasks else [])
    texts = default_policy_texts(spec, lambda: envs.make(cfg.env, **cfg.env_config), train_tasks,
                                 task_options=cfg.task_options, expert_options={}, seed=cfg.seed)
    log.info("building the default %s policy (tokenizer on %d %s training texts) in %s",
             cfg.model_size, len(texts), cfg.env, run.checkpoint(0))
    build_default_policy(texts, run.checkpoint(0), size=cfg.model_size, seed=cfg.seed)
    return load_policy(run.checkpoint(0))


def policy_version(model_dir: str | Path | None) -> int:
    from taurl.policy.files import load_policy_meta

    if not model_dir:
        return 0
    return int(load_policy_meta(model_dir).get("policy_version", 0))


def sample_tasks(env_name: str, split: str, n: int, seed: int,
                 options: dict[str, Any] | None = None) -> list:
    """`n` tasks of `split` from the env's registered task source, shuffled by `seed`."""
    tasks = envs.make_tasks(env_name, split, n=n, seed=seed, **(options or {}))
    if not tasks:
        raise Error(f"no {split!r} tasks for {env_name}")
    random.Random(seed).shuffle(tasks)
    return tasks[:n]


def check_env_builds(make_env: Callable[[], Any], name: str, env_config: dict[str, Any]) -> None:
    """Build the env once and close it: a value its constructor refuses (``top_k: 0``) is an
    error here, before any file is written. A taurl error passes as it is (it says what to fix)."""
    try:
        env = make_env()
    except Error:
        raise
    except Exception as e:  # noqa: BLE001 — a user's env: its own exception, reported with the options
        raise Error(f"env {name!r} could not be built with env_config {env_config}: "
                    f"{type(e).__name__}: {e}") from e
    close = getattr(env, "close", None)
    if callable(close):
        close()


def rollout(cfg: RolloutRunConfig, run_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """`taurl rollout`: run cfg.episodes episodes and store them in the run's ledger."""
    from taurl.data.ledger import Ledger
    from taurl.monitor import MetricsWriter, rollout_metrics
    from taurl.policy.local_engine import LocalEngine
    from taurl.rollout.loop import run_episodes

    cfg = cfg.as_trained()
    n_tasks = -(-cfg.episodes // cfg.group_size)
    env_config = dict(cfg.env_config)
    env_config.setdefault("max_turns", cfg.max_turns)

    def make_env():
        env = envs.make(cfg.env, **env_config)
        if cfg.system_prompt is not None:
            env.system_prompt = cfg.system_prompt
        return env

    # before any file is written: the tasks, and one env (its constructor checks env_config's
    # values)
    tasks = sample_tasks(cfg.env, cfg.split, n_tasks, cfg.seed,
                         {"env_config": cfg.env_config, **cfg.task_options})
    check_env_builds(make_env, cfg.env, env_config)
    run = RunDir.create(run_dir)
    if not run.config.exists():
        # a later rollout into the same run leaves the first config as it was
        # a crash leaves no half config for the next rollout to keep
        atomic_write_text(run.config, dump_config(cfg))
    model, tokenizer = ensure_policy(run, cfg)
    version = policy_version(cfg.model or run.latest_checkpoint())
    engine = LocalEngine(model, tokenizer, version=version, max_batch_size=cfg.concurrency,
                         seed=cfg.seed)

    bar = phase_bar(len(tasks) * cfg.group_size, "rollout", "ep", enabled=progress)
    ledger = Ledger(run.ledger)
    rejected: list[str] = []

    def store(traj) -> None:
        report = ledger.append_many([traj])
        rejected.extend(f"{r.episode_id}: [{r.rule}] {r.detail}" for r in report.rejected)
        bar.update(1)
        bar.set_postfix(reward=f"{traj.reward:.2f}", stop=traj.stop_reason.value)

    t0 = time.perf_counter()
    result = asyncio.run(run_episodes(engine, make_env, tokenizer, tasks,
                                      group_size=cfg.group_size, config=cfg.rollout_config(),
                                      concurrency=cfg.concurrency, seed=cfg.seed,
                                      run_id=run.root.name, on_episode=store))
    wall = time.perf_counter() - t0
    bar.close()
    ledger.close()
    metrics = rollout_metrics(result.trajectories, wall, failed=len(result.failures))
    metrics["rollout/ledger_rejections"] = len(rejected)
    metrics["policy/version"] = version
    MetricsWriter(run.metrics).write(step=0, metrics={"phase": "rollout", **metrics})
    for task_id, why in result.failures:
        log.warning("episode of task %s produced no record: %s", task_id, why)
    for why in rejected:
        log.warning("ledger rejected %s", why)
    return metrics


def export(run_dir: str | Path, fmt: str, out: str | Path | None = None,
           **query: Any) -> tuple[Path, int]:
    """`taurl export`: write the run's trajectories as JSONL or Parquet."""
    from taurl.data.export import export_jsonl, export_parquet
    from taurl.data.ledger import Ledger

    run = RunDir.open(run_dir)
    if fmt not in ("jsonl", "parquet"):
        raise Error(f"unknown export format {fmt!r}; use jsonl or parquet")
    path = Path(out) if out else run.exports / f"trajectories.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with Ledger(run.ledger) as ledger:
        n = (export_jsonl if fmt == "jsonl" else export_parquet)(ledger, path, **query)
    return path, n


def inspect_text(run_dir: str | Path, episode: str | None = None, index: int = 0,
                 color: bool = True) -> str:
    """`taurl inspect`: one trajectory, readable, with its mask shown."""
    from taurl.data.ledger import Ledger
    from taurl.policy.tokenizer import load_tokenizer

    run = RunDir.open(run_dir)
    with Ledger(run.ledger) as ledger:
        if episode:
            traj = ledger.get(episode)
        else:
            trajs = ledger.query(limit=index + 1)
            if len(trajs) <= index:
                raise Error(f"the run has {len(trajs)} trajectories; --index {index} is out of "
                            "range")
            traj = trajs[index]
    ckpt = run.latest_checkpoint()
    tokenizer = load_tokenizer(ckpt) if ckpt else None
    return render_trajectory(traj, tokenizer, color=color)


def render_trajectory(traj, tokenizer=None, color: bool = True) -> str:
    """A readable view: header, then each segment with its kind and mask.

    Sampled text (mask 1) is green; prompt/observation/template text (mask 0) is dim.
    Without color, mask-1 text is wrapped in ⟦…⟧.
    """
    green, dim, bold, reset = ("\033[32m", "\033[2m", "\033[1m",
                               "\033[0m") if color else ("", "", "", "")
    lines = [
        f"{bold}episode{reset} {traj.episode_id}  task {traj.task_id}  group {traj.group_id}  "
        f"split {traj.split}",
        f"env {traj.env_name} ({traj.env_version})  seed {traj.seed}  versions "
        f"{traj.policy_versions}",
        f"reward {traj.reward:g} {json.dumps(traj.reward_components)}  verifier "
        f"{traj.verifier_version or '-'}",
        f"terminated={traj.terminated} truncated={traj.truncated} "
        f"stop_reason={traj.stop_reason.value}  tokens {traj.num_tokens} (sampled "
        f"{traj.num_action_tokens})  turns {len(traj.turns)}  tool calls {traj.num_tool_calls}  "
        f"invalid {traj.num_invalid_actions}",
        f"gold answers: {traj.metadata.get('answers')}",
        "",
    ]
    for i, seg in enumerate(traj.segments):
        text = (tokenizer.decode(list(seg.token_ids), skip_special_tokens=False)
                if tokenizer is not None
                else " ".join(map(str, seg.token_ids)))
        tag = f"[{i}:{seg.kind} mask={seg.mask} n={len(seg.token_ids)}"
        if seg.kind == "action":  # trained on (mask 1), whoever produced it
            if seg.logprobs is None:  # a demonstration: no behaviour policy
                tag += f" source={traj.source}"
            else:
                mean_lp = sum(seg.logprobs) / max(len(seg.token_ids), 1)
                tag += f" v{seg.policy_version} mean_logprob={mean_lp:.2f}"
            body = f"{green}⟦{text}⟧{reset}" if not color else f"{green}{text}{reset}"
        else:
            body = f"{dim}{text}{reset}"
        lines.append(f"{bold}{tag}]{reset} {body}")
    for t in traj.turns:
        extra = f" error={t.error}" if t.error else ""
        lines.append(f"turn {t.index}: action={json.dumps(t.action)} invalid={t.invalid} "
                     f"finish={t.finish_reason}{extra}")
    return "\n".join(lines)


def train(config_path: str | None, overrides: dict[str, Any], run_dir: str | Path,
          progress: bool = True,
          default_config: str | None = None, imports: list[str] | None = None) -> dict[str, Any]:
    """`taurl demo` / `taurl train`: run (or resume) the recipe; returns summary.json."""
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.loop import train as run_recipe
    from taurl.recipe.validate import load_config

    path = config_path or (default_config if default_config and Path(default_config).exists()
                           else None)
    modules = import_modules(path, imports)
    cfg = load_config(TrainConfig, path=path, overrides={**overrides, "imports": modules or None})
    return run_recipe(cfg, str(run_dir), progress=progress)


def summary_text(summary: dict[str, Any], run_dir: str | Path) -> str:
    """The run's closing lines: validation and holdout before and after RL, where the report is."""
    lines = []
    for split in ("validation", "holdout"):
        h = summary[split]
        for tag in ("sft", "final"):
            r = h[tag]
            lines.append(f"{split:<10} {tag:<5} success {r['success']:.3f} (95% CI "
                         f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}, {r['episodes']} episodes of "
                         f"{r['tasks']} tasks)  pass@{r['trials']} {r['pass_at_k']:.3f}  tool-use "
                         f"rate {r['search_rate']:.3f}")
        p = h.get("paired_gain", {})
        paired = (f" (paired {p['difference']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}])"
                  if p else "")
        lines.append(f"{split:<10} gain {h['gain']:+.3f}{paired}; intervals "
                     f"{'overlap' if h['intervals_overlap'] else 'do not overlap'}")
    t = summary["train"]
    stage = t.get("stage", "rl")
    what = (f"{t['updates']} RL updates ({t['estimator']}, {t['objective']})"
            if stage in ("rl", "dpo")
            else f"{t['updates']} {stage} {'rounds' if stage == 'rejection' else 'updates'}")
    lines.append(f"{what}; wall {summary['wall_seconds']:.0f} s")
    lines.append(f"report: {Path(run_dir) / 'report.html'}  summary: "
                 f"{Path(run_dir) / 'summary.json'}")
    return "\n".join(lines)


def evaluate(target: str | Path, config_path: str | None = None, *, split: str = "holdout",
             tasks: int | None = None, trials: int | None = None, temperature: float | None = None,
             progress: bool = True):
    """`taurl eval RUN|CHECKPOINT`: evaluate a run's current policy
    (`taurl.eval.promote.current_version`: the newest checkpoint unless a promotion record or a
    rollback says otherwise), or a checkpoint, on the holdout (or validation) split, with the env,
    prompt and budgets it was trained with."""
    from taurl.envs.tasks import plan_tasks
    from taurl.eval.eval_run import evaluate_policy
    from taurl.policy.files import load_policy_meta
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.validate import load_config

    target = Path(target)
    ckpt = target
    if not (target / "config.json").exists():
        run = RunDir(target)
        if run.latest_checkpoint() is None:
            raise Error(f"{target} is neither a checkpoint (config.json) nor a run directory with "
                        "checkpoints/v<N>")
        from taurl.eval.promote_run import current_checkpoint

        # the current policy: the newest, unless promotions.jsonl says otherwise
        ckpt = current_checkpoint(run)
        if config_path is None and run.config.exists():
            config_path = str(run.config)
    if split not in ("holdout", "validation"):
        raise Error(f"--split must be holdout or validation (got {split!r})")
    recipe = load_policy_meta(ckpt).get("recipe", {})
    envs.import_env_modules(recipe.get("imports", []))
    modules = import_modules(config_path, None)
    saved = {k: recipe[k] for k in ("env", "system_prompt", "tasks", "task_options") if k in recipe}
    if "env_config" in recipe:
        saved["env_config"] = {k: v for k, v in recipe["env_config"].items() if k != "max_turns"}
    for k in (*ROLLOUT_BUDGETS, "compaction"):
        # a policy trained with compaction is evaluated with it
        if k in recipe.get("rollout", {}):
            saved[f"rollout.{k}"] = recipe["rollout"][k]
    overrides = {"eval.tasks": tasks, "eval.trials": trials, "eval.temperature": temperature,
                 "imports": modules or None, "sft.data": "none", "sft.expert_options": {},
                 "sft.demos": 0, "policy.warmup_options": {}}
    if config_path is None:
        overrides.update(saved)  # a bare checkpoint: evaluate it as it was trained
    cfg = load_config(TrainConfig, path=config_path, overrides=overrides)
    plan = plan_tasks(cfg.env, task_file=cfg.tasks, task_options=cfg.task_options, n_demos=0,
                      n_rl=0, n_eval=cfg.eval_tasks, seed=0, eval_seed=cfg.eval_seed,
                      env_config=cfg.env_config)

    def make_env():
        env = envs.make(cfg.env, **cfg.env_kwargs())
        if cfg.system_prompt is not None:
            env.system_prompt = cfg.system_prompt
        return env

    return evaluate_policy(ckpt, getattr(plan, split), cfg.eval_config(), make_env=make_env,
                           rollout=cfg.rollout_config(cfg.eval_temperature),
                           verifier=envs.spec(cfg.env).make_verifier(),
                           tag=f"cli-{split}", progress=progress)


def promote(run_dir: str | Path, candidate: str, baseline: str | None = None,
            progress: bool = True):
    """`taurl promote`: `taurl.eval.promote_run.promote` (the decision is recorded in
    promotions.jsonl)."""
    from taurl.eval.promote_run import promote as run_promote
    from taurl.recipe.config import run_config

    return run_promote(run_dir, candidate, baseline, progress=progress, load_config=run_config)


def rollback(run_dir: str | Path, to: str | None = None):
    """`taurl rollback`: `taurl.eval.promote_run.rollback`."""
    from taurl.eval.promote_run import rollback as run_rollback

    return run_rollback(run_dir, to)
