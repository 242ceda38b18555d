"""The training recipe's evaluations and its summary: each checkpoint evaluated on validation
and holdout (kept in evals/<tag>.json and reused on a resume), and summary.json (SFT vs final,
the train figures, the promotion decision).

Split from `taurl.recipe.loop` so that the loop module holds the phases that train; these
functions only read a finished phase's checkpoints and write their records.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from taurl.data.atomic import atomic_write_text
from taurl.envs.core import Task
from taurl.eval.eval_run import evaluate_policy
from taurl.eval.stats import paired_difference
from taurl.recipe.resume import eval_mismatch, eval_tag
from taurl.recipe.sections import flat_options
from taurl.recipe.stages import stage_summary
from taurl.recipe.state import Run, env_provenance
from taurl.reward.judged import is_judged, shared_judge

log = logging.getLogger("taurl.recipe.loop")  # the recipe's log lines keep one logger name



def evaluate_both(r: Run, tag: str, version: int) -> dict[str, Any]:
    """Validation (for choices) and holdout (to report) of checkpoint `version`."""
    out = {}
    for split, tasks in (("validation", r.plan.validation), ("holdout", r.plan.holdout)):
        out[split] = evaluate_split(r, f"{split}-{tag}", tasks, version)
    return out


def evaluate_split(r: Run, tag: str, tasks: list[Task], version: int) -> dict[str, Any]:
    path = r.run.root / "evals" / f"{tag}.json"
    episodes_tag, c = tag, r.cfg
    if path.exists():
        # reused only when it is this evaluation (version, tasks, trials, seed, temperature)
        stored = json.loads(path.read_text())
        asked = (version, c.eval_trials, c.eval_temperature, c.eval_seed,
                 [t.task_id for t in tasks])
        if not (mismatch := eval_mismatch(stored, *asked)):
            return stored
        # another evaluation gets episodes of its own, never the stored one's from the ledger
        episodes_tag = eval_tag(tag, mismatch, *asked)
    t0 = time.perf_counter()
    result = evaluate_policy(r.run.checkpoint(version), tasks, r.cfg.eval_config(),
                             make_env=r.make_env,
                             rollout=r.cfg.rollout_config(r.cfg.eval_temperature),
                             verifier=r.spec.make_verifier(),
                             ledger=r.ledger, run_id=r.run.root.name, tag=episodes_tag,
                             progress=r.progress, agent=r.cfg.agent, placement=r.placement())
    atomic_write_text(path, json.dumps(result.to_dict(), indent=2))
    r.metrics.write(version, {"phase": f"eval_{tag}", **result.metrics("eval")})
    r.phase_done(f"eval_{tag}", time.perf_counter() - t0)
    lo, hi = result.ci95
    log.info("%s (v%d): success %.3f [%.3f, %.3f] over %d episodes of %d tasks, pass@%d %.3f", tag,
             version,
             result.success, lo, hi, result.episodes, result.tasks, result.trials, result.pass_at_k)
    return result.to_dict()


def cut_by(state: dict[str, Any]) -> list[str]:
    """The safety caps in seconds that cut this run short (sft_max_seconds, rl_max_seconds):
    empty when it ran its step budgets, the only case a seed reproduces on another machine."""
    out = [state["sft_stopped_by"]] if state.get("sft_stopped_by") else []
    return out + [c for c in state.get("rl_stopped_by") or [] if c == "rl_max_seconds"]


def write_summary(r: Run, evals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    versions, v_sft = r.run.versions(), r.state["sft_version"]

    def compare(split: str) -> dict[str, Any]:
        sft_, final = evals["sft"][split], evals["final"][split]
        (a, b), (c, d) = sft_["ci95"], final["ci95"]
        # the same tasks and seeds for both policies: a paired, task-clustered difference
        paired = paired_difference(sft_["task_successes"], final["task_successes"], sft_["trials"])
        return {"sft": sft_, "final": final, "gain": final["success"] - sft_["success"],
                "intervals_overlap": not (c > b or a > d), "paired_gain": paired.to_dict()}

    c = r.cfg
    summary = {
        "run": r.run.root.resolve().name, "env": c.env,
        "env_provenance": env_provenance(r.make_env(), c),
        "holdout": compare("holdout"), "validation": compare("validation"),
        "train": {"updates": versions[-1] - v_sft, "policy_version": versions[-1],
                  "sft_version": v_sft, "sft_steps": r.state.get("sft_steps", 0),
                  "sft_examples": r.state.get("sft_examples", 0),
                  "demos": len(r.plan.demos), "estimator": c.estimator, "objective": c.objective,
                  "group_size": c.group_size, "tasks_per_update": c.tasks_per_update,
                  "sft_planned_steps": r.state.get("sft_planned_steps", 0),
                  "stopped_early": r.state.get("rl_stopped_early"),
                  "stopped_by": r.state.get("rl_stopped_by"),
                  "cut_by": cut_by(r.state), "skipped_task_rows": r.plan.skipped_rows,
                  **stage_summary(r)},
        "model_source": r.state.get("model_source", {"kind": "default", "given": ""}),
        "wall_seconds": r.state.get("timings", {}).get("total", 0.0),
        "timings": r.state.get("timings", {}),
        "config": flat_options(c),
    }
    if is_judged(c.reward):  # the judge's cost: its calls and cache hits in this process
        summary["judge"] = {"version": (j := shared_judge(c.reward)).version, **j.stats}
    # the gate's decision, final vs SFT, from the evaluations above (same tasks and seeds)
    from taurl.eval.promote_run import recipe_promotion

    summary["promotion"] = recipe_promotion(r.run, c.promotion, evals, baseline=v_sft,
                                            candidate=versions[-1])
    atomic_write_text(r.run.summary, json.dumps(summary, indent=2))
    return summary
