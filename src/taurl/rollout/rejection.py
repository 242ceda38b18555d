"""Rejection sampling of the policy's own episodes: which sampled episodes become SFT data.

The recipe's ``sft: rejection`` (`taurl.recipe.stages`) samples ``attempts`` episodes per task
with the policy through the real loop, keeps those that pass every filter below, fine-tunes
on their action tokens, and repeats for ``rounds`` rounds. A kept episode is a policy sample
and stays one: ``source = "policy"``, its behaviour logprobs and policy versions as sampled.

Filters, in the order an episode meets them (each rejection is counted, ``rejection/*``):

* verified — the env's own verifier (`taurl.eval.evaluate.default_verifier`, the one the
  evaluation uses) scores it 1; the training reward is not trusted on its own;
* clean — no tool call the gate denied, no cheat the verifier detected (``action["cheats"]``),
  no constraint violation, no invalid action, no error that ended it;
* length — between ``min_action_tokens`` and ``max_action_tokens`` sampled tokens (0: no bound);
* diversity — among the kept episodes of one task the action-sequence Jaccard similarity
  stays <= ``max_jaccard`` (`taurl.rollout.synth.jaccard`), at most ``per_task`` of them;
* difficulty — the task's bucket by its verified success rate over the attempts
  (`taurl.rollout.synth.difficulty_bucket`: easy, medium, hard) must be in ``buckets``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from taurl.data.trajectory import Trajectory
from taurl.envs.core import Task
from taurl.rollout.options import RejectionOptions
from taurl.rollout.synth import action_sequence, difficulty_bucket, jaccard


@dataclass(frozen=True)
class Kept:
    """The episodes one round keeps, and what each filter rejected."""

    trajs: list[Trajectory]
    stats: dict[str, float]


def is_clean(traj: Trajectory) -> str | None:
    """Why `traj` may not be imitated (a denial, a cheat, a violation, an invalid action, an
    error), or None. A cheat that fooled the reward is exactly what SFT must never copy."""
    for t in traj.turns:
        if t.receipt is not None and t.receipt.decision == "denied":
            return "denied"
        if t.action.get("cheats"):
            return "cheat"
        if t.action.get("violations"):
            return "violation"
        if t.invalid:
            return "invalid"
    if traj.reward_components.get("constraint", 0.0) < 0:
        return "violation"
    return None if traj.valid else "error"


def keep_episodes(trajs: Sequence[Trajectory], tasks: Sequence[Task],
                  verify: Callable[[Trajectory, Task], float],
                  opts: RejectionOptions, attempts: int) -> Kept:
    """The episodes of `trajs` that pass every filter (module docstring), in task order."""
    by_id = {t.task_id: t for t in tasks}
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(t)
    stats: Counter[str] = Counter()
    out: list[Trajectory] = []
    per_task = opts.per_task or attempts
    for task_id, eps in by_task.items():
        verified = [e for e in eps if verify(e, by_id[task_id]) >= 1.0]
        bucket = difficulty_bucket(len(verified) / max(len(eps), attempts))
        stats[f"rejection/tasks_{bucket}"] += 1
        stats["rejection/rejected_unverified"] += len(eps) - len(verified)
        if bucket not in opts.buckets:
            stats["rejection/rejected_bucket"] += len(verified)
            continue
        kept: list[Trajectory] = []
        for e in verified:
            n_act = sum(e.action_mask)
            if why := is_clean(e):
                stats[f"rejection/rejected_{why}"] += 1
            elif n_act < opts.min_action_tokens or (opts.max_action_tokens
                                                    and n_act > opts.max_action_tokens):
                stats["rejection/rejected_length"] += 1
            elif any(jaccard(action_sequence(e), action_sequence(k)) > opts.max_jaccard
                     for k in kept):
                stats["rejection/rejected_duplicate"] += 1
            elif len(kept) >= per_task:
                stats["rejection/rejected_per_task"] += 1
            else:
                kept.append(e)
        out += kept
    stats["rejection/sampled"] = len(trajs)
    stats["rejection/kept"] = len(out)
    return Kept(out, {k: float(v) for k, v in stats.items()})
