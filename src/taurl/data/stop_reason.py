"""Why an episode ended: `StopReason`, an open set of snake_case names.

The loop's own eight reasons have a fixed kind (termination or truncation); an
environment may report any other snake_case name, whose kind is the flag the env set.
"""

from __future__ import annotations

import re
from typing import ClassVar

from taurl.errors import ContractError

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")  # stop reasons and sources: snake_case


class _Reasons(type):
    """Iterating `StopReason` gives the loop's own reasons, as iterating an Enum would."""

    def __iter__(cls):
        return iter(cls.LOOP)

    def __len__(cls) -> int:
        return len(cls.LOOP)


class StopReason(str, metaclass=_Reasons):
    """Why an episode ended: a snake_case name (an open set).

    The loop's own reasons are the class constants; their kind is fixed (`ANSWERED` and
    `NO_ANSWER` are terminations, the rest truncations) and `StopReason(name)` returns the
    constant itself, so ``reason is StopReason.ERROR`` works. Any other name is an env's
    own (``"goal"``, ``"fell"``, ``"timeout"``): its `kind` is None here, and the record's
    terminated/truncated flags say which kind it was. ``reason.value`` is the name.

    >>> StopReason("goal").value, StopReason("goal").kind, StopReason.ANSWERED.kind
    ('goal', None, 'termination')
    """

    __slots__ = ()
    ANSWERED: ClassVar[StopReason]  # the agent gave a final answer
    NO_ANSWER: ClassVar[StopReason]  # the agent ended its turn (EOS) without a final answer
    MAX_TURNS: ClassVar[StopReason]  # the per-episode turn budget ran out
    MAX_TOKENS: ClassVar[StopReason]  # the per-episode budget of sampled tokens ran out
    CONTEXT_FULL: ClassVar[StopReason]  # the next turn would not fit in the model's context
    TOOL_BUDGET: ClassVar[StopReason]  # the tool-call budget ran out
    ERROR: ClassVar[StopReason]  # the env or a tool failed in a way the episode cannot survive
    # the engine aborted the action (pause "abort"); its partial ids are kept
    ABORTED: ClassVar[StopReason]
    LOOP: ClassVar[tuple[StopReason, ...]]  # the eight above, in this order
    _KIND: ClassVar[dict[str, str]] = {}

    def __new__(cls, name: str) -> StopReason:
        if isinstance(name, StopReason):
            return name
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise ContractError("stop_reason_name", f"stop_reason {name!r} is not a snake_case "
                                                    "name "
                                "(lowercase letters, digits and '_', starting with a letter, at "
                                "most 64)")
        loop = cls.__dict__.get("_interned", {})
        return loop[name] if name in loop else super().__new__(cls, name)

    @property
    def value(self) -> str:
        return str.__str__(self)

    @property
    def kind(self) -> str | None:
        """"termination" | "truncation" for the loop's own reasons; None for an env's own."""
        return self._KIND.get(self.value)

    @property
    def is_termination(self) -> bool | None:
        """True/False for the loop's own reasons; None for an env's (see the record's flags)."""
        kind = self.kind
        return None if kind is None else kind == "termination"

    def __repr__(self) -> str:
        return f"StopReason({self.value!r})"


def _define_loop_reasons() -> None:
    reasons = (("ANSWERED", "answered", "termination"), ("NO_ANSWER", "no_answer", "termination"),
               ("MAX_TURNS", "max_turns", "truncation"), ("MAX_TOKENS", "max_tokens", "truncation"),
               ("CONTEXT_FULL", "context_full", "truncation"),
               ("TOOL_BUDGET", "tool_budget", "truncation"),
               ("ERROR", "error", "truncation"), ("ABORTED", "aborted", "truncation"))
    interned = {}
    for attr, name, kind in reasons:
        interned[name] = StopReason(name)
        setattr(StopReason, attr, interned[name])
        StopReason._KIND[name] = kind
    StopReason._interned = interned  # type: ignore[attr-defined]
    StopReason.LOOP = tuple(interned.values())


_define_loop_reasons()
