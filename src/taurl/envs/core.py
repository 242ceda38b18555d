"""The environment API: a small, Gymnasium-flavoured protocol for text agents.

    observation, info = env.reset(task, seed)
    observation, reward, terminated, truncated, info = env.step(action_text)

`terminated`: the episode reached a terminal state of the task (the agent answered, a
goal was reached). `truncated`: the episode was cut short from outside (a budget ran out,
a failure, the agent fell off the map). Never both. When either is true, ``info
["stop_reason"]`` names why: any snake_case name (an open set, `taurl.data.trajectory.
StopReason`); the env's flag is its kind, and the record keeps both. The loop's own
reasons keep their fixed kind (``answered``/``no_answer`` terminate; ``max_turns``,
``max_tokens``, ``context_full``, ``tool_budget``, ``error`` truncate), so an env that
reuses one must set the matching flag. ``error`` marks an invalid sample (not the
agent's doing) and is left out of the loss.

`reset` may report ``info["provenance"]``: a JSON object saying which world the episode
runs in (a corpus fingerprint, a map seed, a snapshot id); the loop keeps it in the
trajectory. `step` info is a `StepInfo`: the keys the loop reads, plus any of the env's own.

An env whose tools do I/O may also offer ``async def astep(action) -> (same as step)``
(`AsyncEnv`); the loop awaits it instead of calling `step`, so other episodes run meanwhile.

An env that holds something open (a server session, a sandbox) may offer ``close()``; each
episode's env comes fresh from the factory, and whoever made it calls `close_env` when the
episode is over, however it ended (the loop may end it on a budget before the env does).

Observations are text. How they enter the token stream is declared by the env:

* ``observation_style = "inline"`` (Search-R1): the whole episode is one assistant
  message; the engine stops at one of `stop` (e.g. ``</search>``), and the observation
  (e.g. ``<information>…</information>``) is encoded once and appended to the stream.
* ``observation_style = "messages"`` (chat tool calls): each observation is a new chat
  message (``role`` in ``info["role"]``, default ``"tool"``), appended as a template delta.

Every env has a ``name`` (``search-v0``), a ``version`` string that changes whenever the
meaning of an observation or reward changes, and JSON-Schema ``tools``.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypedDict, runtime_checkable

from taurl.data.task import Task  # noqa: F401  (its public home is here: `taurl.envs.core.Task`)
from taurl.data.trajectory import ToolReceipt


class StepInfo(TypedDict, total=False):
    """The keys of `step`'s info that the loop reads (each optional; others are the env's own
    and are ignored). `check_env` checks their types."""

    action: dict[str, Any]  # the parsed action, JSON-able, with a "kind" string (always given)
    invalid: bool  # the action could not be parsed / was not allowed (always given)
    receipt: ToolReceipt  # on a tool call: the gate's decision and the execution
    error: str  # an env or tool failure, in words
    stop_reason: str  # why the episode ended (snake_case), when terminated or truncated
    role: str  # messages style: the observation's chat role (default "tool")
    reward_components: dict[str, float]  # the final step's reward, layer by layer
    verifier_version: str  # the version of the verifier that gave the final reward


class ResetInfo(TypedDict, total=False):
    """The key of `reset`'s info that the loop reads (others are the env's own)."""

    provenance: dict[str, Any]  # which world the episode runs in, JSON-able; kept in the record


@runtime_checkable
class Env(Protocol):
    name: str
    version: str
    verifier_version: str  # version of the outcome verifier behind the env's reward
    observation_style: str  # "inline" | "messages"
    stop: tuple[str, ...]  # strings that end an action (inline style)
    tools: list[dict[str, Any]]  # JSON Schema tool declarations (OpenAI function format)
    system_prompt: str

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode. Returns the first observation (usually "") and info
        (a `ResetInfo`: optionally "provenance")."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one action; returns observation, reward, terminated, truncated, info.

        info (a `StepInfo`) carries at least "action" (the parsed action, a dict with
        "kind") and "invalid" (bool); on a tool call also "receipt" (a ToolReceipt); on a
        failure that the episode cannot survive, "error" (str) with truncated=True; when
        the episode ends, "stop_reason" (module docstring).
        """
        ...


@runtime_checkable
class AsyncEnv(Env, Protocol):
    """An `Env` that also offers `astep`, the same step as a coroutine (tools that do I/O)."""

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """`step`, awaited by the loop so that other episodes run while a tool runs."""
        ...


def close_env(env: Any) -> None:
    """Call `env`'s optional ``close()`` (module docstring). A close that fails is logged, not
    raised: the episode it ends is already recorded, and must not be lost to its clean-up."""
    close = getattr(env, "close", None)
    if not callable(close):
        return
    try:
        close()
    except Exception as e:  # noqa: BLE001 — clean-up only (docstring)
        logging.getLogger("taurl.envs").warning("env %s: close() raised %s: %s",
                                                getattr(env, "name", "?"), type(e).__name__, e)


def seen_by_env(turn: Any) -> str:
    """The action of a record's `turn` exactly as the env was given it: what a replay must
    give it too (`action_text` may end with a sampled EOS the env never saw). Duck-typed, so
    a record without `env_text` (one written before it existed) gives `action_text`."""
    text = getattr(turn, "env_text", None)
    return turn.action_text if text is None else text


@contextlib.contextmanager
def episode_env(make_env: Callable[[], Env]) -> Iterator[Env]:
    """A fresh env from `make_env` for one episode, closed (`close_env`) when it is over."""
    env = make_env()
    try:
        yield env
    finally:
        close_env(env)


def task_request_problems(split: str, splits: Sequence[str], families: Iterable[str] | None,
                          known_families: Iterable[str], n: int | None, *,
                          n_may_be_none: bool = False
                          ) -> tuple[list[str], list[str]]:
    """A task source's argument check: (the requested family names, in order and without
    repeats — all of them for None; the problems, each saying how to fix it)."""
    known = list(known_families)
    problems = []
    if split not in splits:
        problems.append(f"split {split!r} is unknown; use one of {tuple(splits)}")
    names = known if families is None else list(dict.fromkeys(families))
    for f in names:
        if f not in known:
            close = difflib.get_close_matches(f, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"family {f!r} is unknown{hint}; known: {', '.join(known)}")
    if not names:
        problems.append("families is empty; pass None for all of them")
    bad_n = isinstance(n, bool) or not isinstance(n, int) or n < 0
    if bad_n and not (n is None and n_may_be_none):
        problems.append(f"n must be {'None or ' if n_may_be_none else ''}an integer >= 0, got "
                        f"{n!r}")
    return names, problems
