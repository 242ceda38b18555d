"""What the `taurl` commands do, as plain functions (the CLI only parses arguments)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from taurl import envs
from taurl.config import RolloutRunConfig, dump_config
from taurl.errors import Error
from taurl.runs import RunDir

log = logging.getLogger("taurl")


def default_policy_texts(env_name: str = "search-v0", split_by: str = "country") -> list[str]:
    """Texts the default tokenizer is trained on: the env's corpus, training questions
    (of the `split_by` split) and prompts."""
    from taurl.envs.search import build_corpus, generate_tasks

    env = envs.make(env_name)
    texts = [d.text for d in build_corpus()]
    texts += [t.prompt for t in generate_tasks("train", split_by=split_by)]  # holdout questions stay unseen
    texts += [env.system_prompt] * 50
    return texts


def ensure_policy(run: RunDir, model: str, size: str, seed: int, env_name: str):
    """Load `model`, or the run's latest checkpoint, or build the default policy as v0."""
    from taurl.policy.model import build_default_policy, load_policy

    if model:
        return load_policy(model)
    latest = run.latest_checkpoint()
    if latest is not None:
        return load_policy(latest)
    log.info("building the default %s policy (tokenizer trained on the %s corpus) in %s",
             size, env_name, run.checkpoint(0))
    build_default_policy(default_policy_texts(env_name), run.checkpoint(0), size=size, seed=seed)
    return load_policy(run.checkpoint(0))


def policy_version(model_dir: str | Path | None) -> int:
    from taurl.policy.model import load_policy_meta

    if not model_dir:
        return 0
    return int(load_policy_meta(model_dir).get("policy_version", 0))


def sample_tasks(env_name: str, split: str, n: int, seed: int, options: dict[str, Any] | None = None) -> list:
    """`n` tasks of `split` from the env's registered task source, shuffled by `seed`."""
    tasks = envs.make_tasks(env_name, split, n=n, seed=seed, **(options or {}))
    if not tasks:
        raise Error(f"no {split!r} tasks for {env_name}")
    random.Random(seed).shuffle(tasks)
    return tasks[:n]


def rollout(cfg: RolloutRunConfig, run_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """`taurl rollout`: run cfg.episodes episodes and store them in the run's ledger."""
    from taurl.ledger import Ledger
    from taurl.monitor import MetricsWriter, rollout_metrics
    from taurl.policy.engine import LocalEngine
    from taurl.rollout import run_episodes

    run = RunDir.create(run_dir)
    run.config.write_text(dump_config(cfg))
    model, tokenizer = ensure_policy(run, cfg.model, cfg.model_size, cfg.seed, cfg.env)
    version = policy_version(cfg.model or run.latest_checkpoint())
    engine = LocalEngine(model, tokenizer, version=version, max_batch_size=cfg.concurrency, seed=cfg.seed)
    n_tasks = -(-cfg.episodes // cfg.group_size)
    tasks = sample_tasks(cfg.env, cfg.split, n_tasks, cfg.seed, cfg.task_options)
    env_config = dict(cfg.env_config)
    env_config.setdefault("max_turns", cfg.max_turns)
    envs.make(cfg.env, **env_config)  # fail fast on a bad env config, before any episode
    bar = tqdm(total=len(tasks) * cfg.group_size, desc="rollout", unit="ep", disable=not progress)
    ledger = Ledger(run.ledger)
    rejected: list[str] = []

    def store(traj) -> None:
        report = ledger.append_many([traj])
        rejected.extend(f"{r.episode_id}: [{r.rule}] {r.detail}" for r in report.rejected)
        bar.update(1)
        bar.set_postfix(reward=f"{traj.reward:.2f}", stop=traj.stop_reason.value)

    t0 = time.perf_counter()
    result = asyncio.run(run_episodes(engine, lambda: envs.make(cfg.env, **env_config), tokenizer, tasks,
                                      group_size=cfg.group_size, config=cfg.rollout_config(),
                                      concurrency=cfg.concurrency, seed=cfg.seed, run_id=run.root.name,
                                      on_episode=store))
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


def export(run_dir: str | Path, fmt: str, out: str | Path | None = None, **query: Any) -> tuple[Path, int]:
    """`taurl export`: write the run's trajectories as JSONL or Parquet."""
    from taurl.export import export_jsonl, export_parquet
    from taurl.ledger import Ledger

    run = RunDir.open(run_dir)
    if fmt not in ("jsonl", "parquet"):
        raise Error(f"unknown export format {fmt!r}; use jsonl or parquet")
    path = Path(out) if out else run.exports / f"trajectories.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with Ledger(run.ledger) as ledger:
        n = (export_jsonl if fmt == "jsonl" else export_parquet)(ledger, path, **query)
    return path, n


def inspect_text(run_dir: str | Path, episode: str | None = None, index: int = 0, color: bool = True) -> str:
    """`taurl inspect`: one trajectory, readable, with its mask shown."""
    from taurl.ledger import Ledger
    from taurl.policy.tokenizer import load_tokenizer

    run = RunDir.open(run_dir)
    with Ledger(run.ledger) as ledger:
        if episode:
            traj = ledger.get(episode)
        else:
            trajs = ledger.query(limit=index + 1)
            if len(trajs) <= index:
                raise Error(f"the run has {len(trajs)} trajectories; --index {index} is out of range")
            traj = trajs[index]
    ckpt = run.latest_checkpoint()
    tokenizer = load_tokenizer(ckpt) if ckpt else None
    return render_trajectory(traj, tokenizer, color=color)


def render_trajectory(traj, tokenizer=None, color: bool = True) -> str:
    """A readable view: header, then each segment with its kind and mask.

    Sampled text (mask 1) is green; prompt/observation/template text (mask 0) is dim.
    Without color, mask-1 text is wrapped in ⟦…⟧.
    """
    green, dim, bold, reset = ("\033[32m", "\033[2m", "\033[1m", "\033[0m") if color else ("", "", "", "")
    lines = [
        f"{bold}episode{reset} {traj.episode_id}  task {traj.task_id}  group {traj.group_id}  split {traj.split}",
        f"env {traj.env_name} ({traj.env_version})  seed {traj.seed}  versions {traj.policy_versions}",
        f"reward {traj.reward:g} {json.dumps(traj.reward_components)}  verifier {traj.verifier_version or '-'}",
        f"terminated={traj.terminated} truncated={traj.truncated} stop_reason={traj.stop_reason.value}  "
        f"tokens {traj.num_tokens} (sampled {traj.num_action_tokens})  turns {len(traj.turns)}  "
        f"tool calls {traj.num_tool_calls}  invalid {traj.num_invalid_actions}",
        f"gold answers: {traj.metadata.get('answers')}",
        "",
    ]
    for i, seg in enumerate(traj.segments):
        text = (tokenizer.decode(list(seg.token_ids), skip_special_tokens=False) if tokenizer is not None
                else " ".join(map(str, seg.token_ids)))
        tag = f"[{i}:{seg.kind} mask={seg.mask} n={len(seg.token_ids)}"
        if seg.kind == "action":
            mean_lp = sum(seg.logprobs or ()) / max(len(seg.token_ids), 1)
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


def train(config_path: str | None, overrides: dict[str, Any], run_dir: str | Path, progress: bool = True,
          default_config: str | None = None) -> dict[str, Any]:
    """`taurl demo` / `taurl train`: run (or resume) the end-to-end pipeline; returns summary.json."""
    from taurl.config import load_config
    from taurl.pipeline import PipelineConfig, run_pipeline

    path = config_path or (default_config if default_config and Path(default_config).exists() else None)
    cfg = load_config(PipelineConfig, path=path, overrides=overrides)
    return run_pipeline(cfg, str(run_dir), progress=progress)


def summary_text(summary: dict[str, Any], run_dir: str | Path) -> str:
    """The demo's closing lines: holdout figures before and after RL, where the report is."""
    h = summary["holdout"]
    lines = []
    for tag in ("sft", "final"):
        r = h[tag]
        lines.append(f"holdout {tag:<5} success {r['success']:.3f} (95% CI {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}, "
                     f"{r['episodes']} episodes)  pass@{r['trials']} {r['pass_at_k']:.3f}  "
                     f"search rate {r['search_rate']:.3f}  tool calls {r['tool_calls_mean']:.2f}")
    lines.append(f"gain {h['gain']:+.3f}; intervals {'overlap' if h['intervals_overlap'] else 'do not overlap'}; "
                 f"{summary['train']['updates']} GRPO updates; wall {summary['wall_seconds']:.0f} s")
    lines.append(f"report: {Path(run_dir) / 'report.html'}  summary: {Path(run_dir) / 'summary.json'}")
    return "\n".join(lines)


def evaluate(target: str | Path, config_path: str | None = None, *, tasks: int | None = None,
             trials: int | None = None, temperature: float | None = None, progress: bool = True):
    """`taurl eval RUN|CHECKPOINT`: holdout evaluation of a run's newest checkpoint or of a checkpoint."""
    from taurl.config import load_config
    from taurl.pipeline import PipelineConfig, evaluate_checkpoint

    target = Path(target)
    ckpt = target
    if not (target / "config.json").exists():
        run = RunDir(target)
        ckpt = run.latest_checkpoint()
        if ckpt is None:
            raise Error(f"{target} is neither a checkpoint (config.json) nor a run directory with checkpoints/v<N>")
        if config_path is None and run.config.exists():
            config_path = str(run.config)
    overrides = {"eval_tasks": tasks, "eval_trials": trials, "eval_temperature": temperature}
    cfg = load_config(PipelineConfig, path=config_path, overrides=overrides)
    return evaluate_checkpoint(ckpt, cfg, progress=progress, tag="cli")
