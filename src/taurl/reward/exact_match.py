"""Exact match, the outcome verifier of Search-R1.

Normalization is SQuAD's `normalize_answer` (Rajpurkar et al. 2016, the official v1.1
evaluation script), which Search-R1 (Jin et al. 2025, arXiv:2503.09516,
`verl/utils/reward_score/qa_em.py`) reuses unchanged:

    lowercase -> drop ASCII punctuation (`string.punctuation`) -> drop the articles
    a / an / the (whole words) -> collapse whitespace

Only ASCII punctuation is removed, so accented letters survive ("São Paulo" ->
"são paulo") and "Sao Paulo" does not match "São Paulo": list both as gold aliases.

    >>> normalize_answer("The  Eiffel Tower!")
    'eiffel tower'
    >>> exact_match("the Euro", ("Euro", "EUR"))
    1.0
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

VERIFIER_VERSION = "em-v1"  # bump whenever normalization or matching changes

_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)  # same chars, one C-level pass
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD / Search-R1 answer normalization (see the module docstring)."""
    s = s.lower()
    s = s.translate(_DROP_PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, golds: Iterable[str] | str) -> float:
    """1.0 if the normalized prediction equals any normalized gold alias, else 0.0."""
    if isinstance(golds, str):  # Search-R1's em_check accepts a bare string too
        golds = (golds,)
    pred = normalize_answer(prediction)
    return 1.0 if any(normalize_answer(g) == pred for g in golds) else 0.0
