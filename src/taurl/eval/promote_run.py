"""The promotion gate applied to a run: the recipe's last step, `taurl promote`, `taurl rollback`.

The decision itself is `taurl.eval.promote.decide` (pure); here are the evaluations it needs and
the record it leaves. Evaluations are reused from ``<run>/evals/*.json`` when one of the
version, split, tasks, trials, seed and temperature exists (the recipe's own SFT and final
evaluations, or an earlier `taurl promote`); a missing one is run with the recipe's eval
settings from the run's config.yaml and kept as ``evals/promote-<split>-v<N>.json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taurl.data.atomic import atomic_write_text
from taurl.data.runs import RunDir
from taurl.errors import Error
from taurl.eval.evaluate import EvalResult
from taurl.eval.promote import (
    PromotionConfig,
    PromotionDecision,
    append_record,
    current_version,
    decide,
    read_records,
    rollback_record,
    rollback_target,
)

SPLITS = ("holdout", "validation")
log = logging.getLogger("taurl.eval.promote")


def recipe_promotion(run: RunDir, promotion: PromotionConfig,
                     evals: dict[str, dict[str, dict[str, Any]]], baseline: int,
                     candidate: int) -> dict[str, Any]:
    """The recipe's last step: the final policy (`candidate`) against the SFT one (`baseline`)
    from the evaluations the recipe already ran; appends the record once (a resumed run that
    finds its record reuses it) and logs the decision."""
    for rec in read_records(run.root):
        if (rec.get("source") == "recipe" and rec["candidate"] == candidate
            and rec.get("baseline") == baseline):
            log.info(_line(rec))
            return rec
    as_results = {tag: {s: EvalResult.from_dict(evals[tag][s]) for s in SPLITS}
                  for tag in ("sft", "final")}
    decision = decide(as_results["final"], as_results["sft"], promotion,
                      candidate_version=candidate, baseline_version=baseline,
                      current=current_version(run.root), source="recipe")
    append_record(run.root, decision)
    log.info(decision.line())
    return decision.to_dict()


def _line(rec: dict[str, Any]) -> str:
    return PromotionDecision(**rec).line()


# -- taurl promote / rollback / eval ------------------------------------------------------

def _version(text: str | int, flag: str) -> int:
    s = str(text)
    digits = s[1:] if s[:1] in ("v", "V") else s
    if not digits.isdigit():
        raise Error(f"{flag} takes a policy version such as v3 or 3 (got {text!r})")
    return int(digits)


def _open_run(run_dir: str | Path) -> RunDir:
    run = RunDir(Path(run_dir))
    if not run.config.exists() or not run.versions():
        raise Error(f"{run_dir} is not a training run directory (it needs config.yaml and "
                    "checkpoints/v<N>); give the directory `taurl train --run-dir` wrote")
    return run


def _need_version(run: RunDir, v: int, flag: str) -> None:
    if v not in run.versions():
        raise Error(f"{flag} v{v}: {run.root} has no checkpoint v{v} (it has "
                    f"{', '.join(f'v{x}' for x in run.versions())}; training keeps the newest "
                    "keep_checkpoints, v0, the SFT version and promoted ones — keep_checkpoints: 0 "
                    "keeps all)")


def _matches(d: dict[str, Any], version: int, split: str, tasks: list, cfg: Any) -> bool:
    return (d.get("policy_version") == version and d.get("split") == split
            and d.get("trials") == cfg.eval_trials
            and d.get("eval_seed") == cfg.eval_seed and d.get("temperature") == cfg.eval_temperature
            and "wall_s_per_success" in d  # older files lack the safety and cost figures
            and set(d.get("task_successes", {})) == {t.task_id for t in tasks})


def find_or_evaluate(run: RunDir, cfg: Any, plan: Any, version: int, split: str,
                     progress: bool = True) -> EvalResult:
    """`version`'s evaluation on `split` (module docstring: reused, else run and kept)."""
    tasks = getattr(plan, split)
    for path in sorted((run.root / "evals").glob("*.json")):
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(d, dict) and _matches(d, version, split, tasks, cfg):
            return EvalResult.from_dict(d)
    from taurl import envs
    from taurl.data.ledger import Ledger
    from taurl.eval.eval_run import evaluate_policy

    def make_env():
        env = envs.make(cfg.env, **cfg.env_kwargs())
        if cfg.system_prompt is not None:
            env.system_prompt = cfg.system_prompt
        return env

    tag = f"promote-{split}-v{version}"
    with Ledger(run.ledger) as ledger:
        result = evaluate_policy(run.checkpoint(version), tasks, cfg.eval_config(),
                                 make_env=make_env,
                                 rollout=cfg.rollout_config(cfg.eval_temperature),
                                 verifier=envs.spec(cfg.env).make_verifier(), ledger=ledger,
                                 run_id=run.root.name, tag=tag, progress=progress)
    atomic_write_text(run.root / "evals" / f"{tag}.json", json.dumps(result.to_dict(), indent=2))
    return result


def _default_baseline(run: RunDir, candidate: int) -> int:
    cur = current_version(run.root)
    if cur != candidate:
        return cur
    earlier = rollback_target(read_records(run.root))
    if earlier is not None:
        return earlier
    raise Error(f"v{candidate} is already the current policy and no earlier promoted version "
                "exists: name the baseline with --baseline vM")


def promote(run_dir: str | Path, candidate: str | int, baseline: str | int | None = None,
            progress: bool = True, *, load_config: Callable[[RunDir], Any]) -> PromotionDecision:
    """`taurl promote RUN --candidate vN [--baseline vM]`: evaluate what is missing, decide, record.
    The baseline defaults to the current policy (or, when that is the candidate, the
    promoted version before it). Every input is checked before any evaluation or file.

    load_config(run): the run's training config (`taurl.recipe.config.run_config`; given by
    the caller, so that this evaluation stage does not import the recipe above it)."""
    from taurl.envs.tasks import plan_tasks

    run = _open_run(run_dir)
    cand = _version(candidate, "--candidate")
    _need_version(run, cand, "--candidate")
    base = _default_baseline(run, cand) if baseline is None else _version(baseline, "--baseline")
    _need_version(run, base, "--baseline")
    if base == cand:
        raise Error(f"--candidate and --baseline are both v{cand}: a promotion compares two "
                    "versions")
    cfg = load_config(run)
    thresholds = cfg.promotion
    plan = plan_tasks(cfg.env, task_file=cfg.tasks, task_options=cfg.task_options, n_demos=0,
                      n_rl=0, n_eval=cfg.eval_tasks, seed=0, eval_seed=cfg.eval_seed,
                      env_config=cfg.env_config)
    evals = {v: {s: find_or_evaluate(run, cfg, plan, v, s, progress) for s in SPLITS}
             for v in (cand, base)}
    decision = decide(evals[cand], evals[base], thresholds, candidate_version=cand,
                      baseline_version=base, current=current_version(run.root), source="cli")
    append_record(run.root, decision)
    return decision


def rollback(run_dir: str | Path, to: str | int | None = None) -> PromotionDecision:
    """`taurl rollback RUN [--to vM]`: make the previous promoted version (or vM) current again."""
    run = _open_run(run_dir)
    cur = current_version(run.root)
    if to is None:
        target = rollback_target(read_records(run.root))
        if target is None:
            raise Error(f"{run.root}: no earlier promoted version to roll back to (current "
                        f"v{cur}); name one with --to vM")
    else:
        target = _version(to, "--to")
    _need_version(run, target, "--to")
    if target == cur:
        raise Error(f"v{target} is already the current policy; nothing to roll back")
    record = rollback_record(cur, target)
    append_record(run.root, record)
    return record


def current_checkpoint(run: RunDir) -> Path:
    """The checkpoint `taurl eval RUN` evaluates: the run's current version (`current_version`)."""
    v = current_version(run.root)
    if v not in run.versions():
        raise Error(f"{run.root}: the current policy v{v} (promotions.jsonl) has no checkpoint; "
                    "roll back to an existing version with `taurl rollback RUN --to vM`")
    return run.checkpoint(v)
