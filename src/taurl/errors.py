"""One error hierarchy: every exception taurl raises on purpose derives from `Error`.

Messages say what was wrong and how to fix it.
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every taurl error."""


class ConfigError(Error, ValueError):
    """A configuration is invalid. All problems found are listed in the message."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid configuration ({len(self.problems)} problem(s)):\n{lines}")


class ContractError(Error, ValueError):
    """A record breaks one of the trajectory contracts (docs/design.md#contracts).

    `rule` is the short, stable name of the broken rule (e.g. ``mask_length``).
    """

    def __init__(self, rule: str, detail: str):
        self.rule = rule
        self.detail = detail
        super().__init__(f"[{rule}] {detail}")


class UnknownEnvError(Error, KeyError):
    """No environment is registered under that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ResetNeeded(Error, RuntimeError):
    """`step` was called before `reset` or after the episode ended."""


class EngineError(Error, RuntimeError):
    """The inference engine could not serve a request."""


class UnknownEpisodeError(Error, KeyError):
    """The ledger holds no trajectory with that episode_id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class SandboxError(Error, RuntimeError):
    """The sandbox cannot run a command safely (isolation unavailable or misused)."""


class EnvCheckError(Error, AssertionError):
    """An environment breaks the Env protocol (found by `taurl.envs.checker.check_env`)."""
