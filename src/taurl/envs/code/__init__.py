"""code-v0: Python function-writing tasks in a sandbox, judged by hidden tests.

Not registered here: `taurl.envs` registers ``code-v0`` with `CodeEnv` as factory.
"""

from taurl.envs.code.env import CodeEnv, format_exec, snapshot
from taurl.envs.code.expert import expert, planted_bug, tool_call
from taurl.envs.code.holdout import ReplayVerifier, make_holdout_verifier
from taurl.envs.code.tasks import (
    FAMILIES,
    PASS_MARKER,
    SPLITS,
    generate_tasks,
    hidden_cases,
    make_task,
    reference_source,
    visible_cases,
)
from taurl.envs.code.verifier import VERIFIER_VERSION, HiddenTestVerifier, Submission


def make_verifier(**kwargs) -> HiddenTestVerifier:
    """A fresh hidden-test verifier of a `Submission` (the env's training reward uses one;
    the holdout evaluator uses `make_holdout_verifier`, which judges whole records)."""
    return HiddenTestVerifier(**kwargs)


__all__ = [
    "FAMILIES",
    "PASS_MARKER",
    "VERIFIER_VERSION",
    "CodeEnv",
    "HiddenTestVerifier",
    "ReplayVerifier",
    "SPLITS",
    "Submission",
    "expert",
    "format_exec",
    "generate_tasks",
    "hidden_cases",
    "make_holdout_verifier",
    "make_task",
    "make_verifier",
    "planted_bug",
    "reference_source",
    "snapshot",
    "tool_call",
    "visible_cases",
]
