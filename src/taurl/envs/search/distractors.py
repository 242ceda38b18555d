"""search-v0's long-horizon family ``city_distractors_capital``: a two-hop question that
names `k` distractor cities beside its subject, where the first search decides the outcome.

    Not Tarbes, Kumba, Yanji or Olinda: what is the capital of the country where the city of Lyon
    lies?

Every distractor is a city of another country (whose capital differs from the gold one),
drawn from the same split's two-hop tasks, so a distractor names nothing of another split
(the leakage filter of `taurl.envs.search.questions` already ran on those tasks). The
expert's procedure is ``k + 3`` actions — search the first city, search every other named
city (the *distractor searches*: their documents name other countries and change nothing),
search the capital of the first city's country, answer — so with the default ``k = 8``
an episode is 11 actions. Its quality knob ``p_first_distractor`` makes the first search
a distractor; the expert then commits to that city's country and answers its capital,
which the verifier rejects. Only the first query separates a success from a failure; the
k + 2 actions after it are the same kind in both, which is what makes the family a test
of step-level credit (GRPO gives every one of them the episode's outcome).

The family is opt-in: ``task_options: {families: [city_distractors_capital],
distractors: 8}``; the default family list (all of `taurl.envs.search.questions.FAMILIES`)
does not include it, so existing task plans do not move.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from taurl.envs.core import Task
from taurl.errors import ConfigError
from taurl.reward.exact_match import normalize_answer

FAMILY = "city_distractors_capital"
BASE_FAMILY = "city_country_capital"  # the two-hop tasks the family is built from
HOPS = 2
MAX_DISTRACTORS = 27  # k + 3 <= 30 actions


def check_distractors(k: object) -> list[str]:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DISTRACTORS:
        return [f"distractors must be an integer in [1, {MAX_DISTRACTORS}] (an episode is "
                f"distractors + 3 actions), got {k!r}"]
    return []


def prompt_of(subject: str, distractors: list[str]) -> str:
    names = (distractors[0] if len(distractors) == 1 else f"{', '.join(distractors[:-1])} or "
                                                          f"{distractors[-1]}")
    return f"Not {names}: what is the capital of the country where the city of {subject} lies?"


def _norms(task: Task) -> set[str]:
    return {normalize_answer(a) for a in task.answers}


def distractor_tasks(base: Sequence[Task], k: int) -> list[Task]:
    """One distractor task per task of `base` (the split's ``city_country_capital`` tasks,
    in canonical order); each draws its `k` distractors from the other tasks of `base` with
    a seed of its own id, so a task's distractors do not depend on which others exist."""
    if problems := check_distractors(k):
        raise ConfigError(problems)
    out = []
    for task in base:
        rng = random.Random(f"{FAMILY}:{task.task_id}")
        gold, bridge = _norms(task), task.metadata["bridge"]
        picked: list[Task] = []
        for j in rng.sample(range(len(base)), min(len(base), 4 * k + 8)):
            other = base[j]
            if (other.metadata["bridge"] != bridge and not _norms(other) & gold
                    and all(other.metadata["bridge"] != p.metadata["bridge"] for p in picked)):
                picked.append(other)
            if len(picked) == k:
                break
        if len(picked) < k:
            continue  # too few countries in a small split: the task is left out, never padded
        names = [p.metadata["subject"] for p in picked]
        meta = {**task.metadata, "family": FAMILY, "hops": HOPS, "distractors": [
            {"city": p.metadata["subject"], "country": p.metadata["bridge"],
             "capital": p.answers[0]}
            for p in picked]}
        meta["entities"] = list(dict.fromkeys(
            [*task.metadata["entities"], *(e for p in picked for e in p.metadata["entities"])]))
        out.append(Task(task_id=f"search-v0/{FAMILY}/{k}/{task.metadata['subject_id']}",
                        prompt=prompt_of(task.metadata["subject"], names), answers=task.answers,
                        split=task.split, env=task.env, metadata=meta))
    return out


def distractor_actions(task: Task, rng: random.Random, p_first_distractor: float) -> list[str]:
    """The expert's ``k + 3`` actions for a distractor task (module docstring)."""
    subject, gold = task.metadata["subject"], task.answers[0]
    cities = [(subject, task.metadata["bridge"], gold)] + [
        (d["city"], d["country"], d["capital"]) for d in task.metadata["distractors"]]
    first = cities[0]
    if rng.random() < p_first_distractor:
        first = cities[1 + rng.randrange(len(cities) - 1)]
    city, country, capital = first
    actions = [f"<think>I need to find {city}.</think>\n<search> {city}</search>"]
    actions += [f"<think>{name} is not it, but let me check.</think>\n<search> {name}</search>"
                for name, _, _ in cities if name != city]
    actions.append(f"<think>{city} is in {country}. Now I need capital of {country}.</think>\n"
                   f"<search> {country} capital</search>")
    actions.append(f"<think>I found it.</think>\n<answer> {capital}</answer>")
    return actions
