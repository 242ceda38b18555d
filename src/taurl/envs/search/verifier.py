"""search-v0's own verifier for the evaluator (`taurl.envs.spec.Verifier`).

`SearchVerifier()(traj, task) -> 1.0 | 0.0` re-derives the outcome from the record: the
final turn's parsed action must be an answer that ended the episode (``terminated``), and
its text must exactly match a gold alias of `task` under SQuAD normalization
(`taurl.reward.exact_match`). It never reads the record's reward, reward components or
verifier version, so an edited reward cannot pass as a success.

It is the same rule the env's reward applies, computed again by an instance that has seen
no training episode and keeps no cache (docs/design.md#reward): an exact-match task has no hidden
state to re-check, so independence here means "from the record's answer, not from its
reward". Register it as ``register("search-v0", ..., verifier=SearchVerifier)``.
"""

from __future__ import annotations

from typing import Any

from taurl.envs.core import Task
from taurl.reward.exact_match import VERIFIER_VERSION, exact_match


class SearchVerifier:
    """Exact match of the record's final answer (module docstring). Stateless but `calls`."""

    name = "search-v0/exact-match"
    version = VERIFIER_VERSION

    def __init__(self) -> None:
        self.calls = 0  # records judged (tests and reports check the evaluator used it)

    def __call__(self, traj: Any, task: Task) -> float:
        self.calls += 1
        if traj.task_id != task.task_id:
            return 0.0
        last = traj.turns[-1].action if traj.turns else {}
        if last.get("kind") != "answer" or not traj.terminated:
            return 0.0
        return exact_match(str(last.get("answer", "")), task.answers)
