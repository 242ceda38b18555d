"""The holdout verifier of code-v0: rebuild the submitted workspace from the record, then
run the hidden tests on it with a verifier of its own.

`ReplayVerifier()(traj, task) -> 1.0 | 0.0` never reads the record's reward, verdict or
observations. It re-derives the outcome from what the agent *did*:

1. the record must be of `task` and end by the agent's submit (stop reason ``answered``,
   the last turn a submit call); anything else is 0;
2. each turn's action text — the model's own text as the env was given it
   (`seen_by_env`: a sampled EOS cut), not the receipt's shortened arguments — is
   played, in order, through a fresh `CodeEnv` (a new sandbox per record)
   offering the tools the record's provenance names (the env option ``tools``;
   ``compact_tools`` changes only what the prompt shows, not what a call does, so the
   replay does not need it), read by the parser the record names (``parser``; a record
   without one is from version 1, which read tagged calls only: ``hermes``), so the
   workspace at submit is the one the agent built, including whatever its
   ``run_python`` and ``run_tests`` calls did to it;
3. the replayed episode must end on the record's last turn, by that submit; the
   hidden tests then run in a fresh sandbox through the verifier's own
   `HiddenTestVerifier` instance (integrity rules included: a detected cheat is 0).

What this catches: a reward edited in the record, a submission the record's actions do
not produce (an edited action, an observation that claims a pass), an episode cut
before its submit. Departure from an exact re-execution: code whose output depends on
time or randomness may behave differently when replayed; the hidden tests themselves
are a pure function of the task, so an honest solution gets the same verdict.
"""

from __future__ import annotations

from typing import Any

from taurl.envs.code.env import CodeEnv
from taurl.envs.code.verifier import VERIFIER_VERSION, HiddenTestVerifier
from taurl.envs.core import Task, seen_by_env
from taurl.errors import ConfigError
from taurl.tools.sandbox import SandboxConfig

VERSION = f"code-replay-v2+{VERIFIER_VERSION}"  # bump the first part when the replay rules change


class ReplayVerifier:
    """See the module docstring. One instance may judge many records (nothing is cached)."""

    version = VERSION

    def __init__(self, *, root: str | None = None,
                 sandbox_config: SandboxConfig | None = None) -> None:
        self.root = root
        self.sandbox_config = sandbox_config
        self.last_detail = ""  # why the last record got its score (for reports and tests)

    def __call__(self, traj: Any, task: Task) -> float:
        score, self.last_detail = self.judge(traj, task)
        return score

    def judge(self, traj: Any, task: Task) -> tuple[float, str]:
        """(score, why) for one record."""
        if traj.task_id != task.task_id:
            return 0.0, f"the record is of task {traj.task_id!r}, not {task.task_id!r}"
        turns = list(traj.turns)
        if getattr(traj.stop_reason, "value", traj.stop_reason) != "answered" or not turns:
            return 0.0, f"the episode did not end by a submit (stop reason {traj.stop_reason!s})"
        # the verifier's own instance, never the env's or the training run's
        own = HiddenTestVerifier(root=self.root)
        provenance = getattr(traj, "provenance", None) or {}
        tools = provenance.get("tools")  # the tool set the episode had
        parser = provenance.get("parser", "hermes")  # how its actions were read
        try:
            env = CodeEnv(max_turns=len(turns) + 1, root=self.root,
                          sandbox_config=self.sandbox_config,
                          tools=tools, verifier_factory=lambda: own, parser=parser)
        except ConfigError as e:
            return 0.0, f"the record's provenance names no valid tool set or parser: {e}"
        try:
            env.reset(task, traj.seed)
            for i, turn in enumerate(turns):
                _obs, _r, terminated, truncated, info = env.step(seen_by_env(turn))
                if terminated or truncated:
                    if i != len(turns) - 1:
                        return (
                            0.0,
                            f"the replay ended at turn {i + 1}, the record at turn {len(turns)}",
                        )
                    if not terminated or info.get("stop_reason") != "answered":
                        return (
                            0.0,
                            f"the replayed episode ended by {info.get('stop_reason')}, not a "
                            "submit",
                        )
                    verdict = info.get("verdict") or {}
                    outcome = float(info["reward_components"].get("outcome", 0.0))
                    return outcome, str(verdict.get("detail", ""))
            return 0.0, "the record's actions do not end by a submit"
        finally:
            env.close()


def make_holdout_verifier() -> ReplayVerifier:
    """A fresh holdout verifier (the registered `verifier` factory of code-v0)."""
    return ReplayVerifier()
