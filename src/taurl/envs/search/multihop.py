"""search-multihop-v0: search-v0's loop on questions whose answer takes two searches.

    What is the capital of the country where the city of Tarbes lies?

The city's document names its country (the *bridge*) and only the country's document
holds the answer (a capital or a currency), so a policy must search the city, copy the
country out of what it read into a second query, and copy the answer out of the second
result. The questions are search-v0's two-hop families (`taurl.envs.search.questions`),
which already drop every task whose answer appears in the city's own document (a capital
city, or a city document that names the capital): one search can never be enough.

Splits: by country by default (``split_by: country``), so a holdout question's city,
country and answer are all names no training question contains; a model cannot have
learned "cities of France -> Paris" in training and answer from memory after one search.
The split is search-v0's (tested there); the tasks are relabelled with this env's name.

Reachable: a task is kept only if the expert's second query (``<country> capital``) puts
a document that shows the answer in its first 120 characters at the top of the ranking
(`reachable`): at the env's defaults (``top_k: 1``, ``max_doc_chars: 120``) the second search
then always shows the answer. Without it ``France capital`` ranks Fort-de-France first,
``Spain capital`` Port of Spain, and every Costa Rica query a Brazilian town of that name,
so a demonstration would answer from memory after a search that did not show the answer.

Expert: `multihop_expert`, search-v0's expert without its degrading knobs (it searches the
city, then ``<country> capital`` / ``<country> currency``, then answers the gold answer);
its demonstrations are correct by construction and the tests check them with the verifier.
Verifier: exact match of the final answer (`MultiHopVerifier`, search-v0's rule).
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Iterable
from typing import Any

from taurl.envs.core import Task
from taurl.envs.search.env import SearchEnv
from taurl.envs.search.expert import bridge_query, search_expert
from taurl.envs.search.questions import FAMILIES, generate_tasks
from taurl.envs.search.retriever import shared_retriever
from taurl.envs.search.verifier import SearchVerifier
from taurl.errors import ConfigError

ENV_NAME = "search-multihop-v0"
MULTIHOP_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.hops == 2)
HOPS = 2
SHOWN_CHARS = 120  # MultiHopSearchEnv's max_doc_chars: what the policy sees of a document


class MultiHopSearchEnv(SearchEnv):
    """`SearchEnv` under its own name, with room for two searches and an answer."""

    name = ENV_NAME

    def __init__(self, top_k: int = 1, max_turns: int = 4, max_doc_chars: int | None = 120,
                 **options: Any):
        super().__init__(top_k=top_k, max_turns=max_turns, max_doc_chars=max_doc_chars, **options)


def _relabel(task: Task) -> Task:
    """search-v0's task under this env's name (its id, env and metadata say so)."""
    _, family, subject_id = task.task_id.split("/", 2)
    return dataclasses.replace(task, task_id=f"{ENV_NAME}/{family}/{subject_id}", env=ENV_NAME,
                               metadata={**task.metadata, "source_task": task.task_id})


def multihop_tasks(split: str, n: int | None = None, seed: int = 0,
                   families: Iterable[str] | None = None, split_by: str = "country") -> list[Task]:
    """Up to `n` two-hop tasks of `split`, balanced across `families` (default: both
    two-hop families), with search-v0's splits at granularity `split_by`."""
    names = list(MULTIHOP_FAMILIES if families is None else families)
    if bad := [f for f in names if f not in MULTIHOP_FAMILIES]:
        raise ConfigError(f"search-multihop-v0 families are {list(MULTIHOP_FAMILIES)}; "
                          f"{bad} are not two-hop (use search-v0 for one-hop questions)")
    tasks = generate_tasks(split, n=None, seed=seed, families=names, split_by=split_by)
    kept = [_relabel(t) for t in tasks if reachable(t)]
    return kept if n is None else kept[:n]


def reachable(task: Task) -> bool:
    """Does the top hit of the expert's second query (`bridge_query`) show the answer within
    `SHOWN_CHARS`?"""
    return _shows(bridge_query(task), task.answers[0])


@functools.lru_cache(maxsize=4096)  # one search per (country, asked): ~10^2, not 10^4 tasks
def _shows(query: str, answer: str) -> bool:
    hits = shared_retriever().search(query, 1)
    return bool(hits) and answer.lower() in hits[0].doc.text[:SHOWN_CHARS].lower()


def multihop_expert(task: Task, rng: random.Random) -> list[str]:
    """The expert's three actions: search the city, search its country's capital or
    currency, answer. No knob degrades it: every demonstration is meant to be correct."""
    if task.metadata.get("hops") != HOPS or not task.metadata.get("bridge"):
        raise ConfigError(f"task {task.task_id!r} is not a two-hop task (no bridge entity)")
    return search_expert(task, rng)


class MultiHopVerifier(SearchVerifier):
    """search-v0's exact-match verifier under this env's name."""

    name = f"{ENV_NAME}/exact-match"
