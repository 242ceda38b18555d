"""search-v0's scripted expert (an `taurl.envs.spec.Expert`): it knows which query finds
the answer — the task's subject, then for two-hop questions its bridge entity — and
writes the Search-R1 actions a good policy would.

Quality knobs degrade it on purpose (docs/demo.md documents them): with probability
`p_skip_search` it answers without searching, from its own "knowledge", which is right
with probability `p_guess_right`. This is the demo's lever: SFT on such demonstrations
teaches the *format* (think, search, read, answer) but also a bad *strategy* (answer from
memory some of the time), which reinforcement learning then has to unlearn.

    register("search-v0", SearchEnv, expert=search_expert, ...)
    actions = search_expert(task, random.Random(0), p_skip_search=0.5)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from taurl.envs.core import Task
from taurl.envs.search.distractors import distractor_actions
from taurl.errors import ConfigError
from taurl.tools.parsers import tool_call_text


def search_expert(task: Task, rng: random.Random, p_skip_search: float = 0.0,
                  p_guess_right: float = 0.5, p_first_distractor: float = 0.0) -> list[str]:
    """The expert's actions for `task`, one string per turn (Search-R1 format).

    Draws from `rng` in a fixed order (skip?, then right guess?), so a seeded rng gives
    the same demonstrations every time. A ``city_distractors_capital`` task gets the
    distractor procedure instead (`taurl.envs.search.distractors.distractor_actions`: with
    probability `p_first_distractor` the first search is a distractor and the answer wrong).
    """
    problems = [f"{name} must be a probability in [0, 1], got {p!r}"
                for name, p in (("p_skip_search", p_skip_search), ("p_guess_right", p_guess_right),
                                ("p_first_distractor", p_first_distractor))
                if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1]
    if problems:
        raise ConfigError(problems)
    if task.metadata.get("distractors"):
        return distractor_actions(task, rng, p_first_distractor)
    subject = task.metadata.get("subject", task.prompt)
    answer = task.answers[0]
    if rng.random() < p_skip_search:
        guess = answer if rng.random() < p_guess_right else subject
        return [f"<think>I know this.</think>\n<answer> {guess}</answer>"]
    actions = [f"<think>I need to find {subject}.</think>\n<search> {subject}</search>"]
    bridge = task.metadata.get("bridge")
    if bridge:
        kind = task.metadata.get("answer_kind", "")
        actions.append(f"<think>{subject} is in {bridge}. Now I need {kind} of "
                       f"{bridge}.</think>\n<search> {bridge_query(task)}</search>")
    actions.append(f"<think>I found it.</think>\n<answer> {answer}</answer>")
    return actions


# ---------------------------------------------------------------------------------------
# The earlier API (taurl.rollout.synth.expert_actions / ExpertQuality), kept for existing callers


@dataclass(frozen=True)
class ExpertQuality:
    """How good the scripted expert is; the defaults are a perfect expert."""

    p_skip_search: float = 0.0  # share of demos that answer without searching
    p_guess_right: float = 0.5  # when skipping, chance that the guess is right

    def options(self) -> dict[str, float]:
        """The `search_expert` keyword arguments (the config's ``expert_options``)."""
        return {"p_skip_search": self.p_skip_search, "p_guess_right": self.p_guess_right}


def expert_actions(task: Task, quality: ExpertQuality = ExpertQuality(),
                   rng: random.Random | None = None) -> list[str]:
    """`search_expert` with the knobs of `quality` (and ``random.Random(0)`` by default)."""
    return search_expert(task, rng or random.Random(0), **quality.options())


def search_tool_expert(task: Task, rng: random.Random, **options: Any) -> list[str]:
    """`search_expert` in the proxy's wire format (same knobs and draws)
    with each ``<search> q</search>`` as a ``search`` tool call and the answer as the reply."""
    out = []
    for action in search_expert(task, rng, **options):
        m = re.search(r"<search>(.*?)</search>", action, re.DOTALL)
        if m:
            out.append(tool_call_text("search", {"query": m.group(1).strip()}))
        else:
            out.append(re.search(r"<answer>.*?</answer>", action, re.DOTALL).group(0))
    return out


def bridge_query(task: Task) -> str:
    """The expert's second search of a two-hop task: the bridge entity and what is asked of
    it (``France capital``, ``Japan currency``)."""
    kind = task.metadata.get("answer_kind", "")
    return f"{task.metadata['bridge']} {'capital' if kind == 'city' else kind}".strip()
