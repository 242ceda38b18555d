"""code-v0: Python function-writing tasks in a sandbox, judged by hidden tests.

Not registered here: `taurl.envs` registers ``code-v0`` with `CodeEnv` as factory.
"""

from taurl.envs.code.env import CodeEnv, format_exec, snapshot
from taurl.envs.code.tasks import (
    FAMILIES,
    PASS_MARKER,
    generate_tasks,
    hidden_cases,
    make_task,
    reference_source,
    visible_cases,
)
from taurl.envs.code.verifier import VERIFIER_VERSION, HiddenTestVerifier, Submission


def make_verifier(**kwargs) -> HiddenTestVerifier:
    """A fresh, independent verifier (what the holdout evaluator should use)."""
    return HiddenTestVerifier(**kwargs)


__all__ = [
    "FAMILIES",
    "PASS_MARKER",
    "VERIFIER_VERSION",
    "CodeEnv",
    "HiddenTestVerifier",
    "Submission",
    "format_exec",
    "generate_tasks",
    "hidden_cases",
    "make_task",
    "make_verifier",
    "reference_source",
    "snapshot",
    "visible_cases",
]
