"""Exact match: SQuAD / Search-R1 normalization, reproduced case by case."""

from __future__ import annotations

import pytest

from taurl.reward import VERIFIER_VERSION, exact_match, normalize_answer


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        # the four steps of SQuAD's normalize_answer, one at a time
        ("Denver Broncos", "denver broncos"),  # lowercase
        ("Paris.", "paris"),  # punctuation
        ("St. John's", "st johns"),
        ("Europe/Paris", "europeparis"),  # '/' is ASCII punctuation: dropped, not a space
        ("America/New_York", "americanewyork"),  # so is '_'
        ("the Denver Broncos", "denver broncos"),  # articles
        ("A Tale of Two Cities", "tale of two cities"),
        ("an apple", "apple"),
        ("  Barack \t Obama \n", "barack obama"),  # whitespace
        # articles go only as whole words, after punctuation is gone
        ("Theatre", "theatre"),
        ("Anaheim", "anaheim"),
        ("the-end", "theend"),
        ("The The", ""),
        # Unicode: only ASCII punctuation is removed; letters keep their accents
        ("São Paulo", "são paulo"),
        ("Zürich!", "zürich"),
        ("Bogotá", "bogotá"),
        ("1990–1995", "1990–1995"),  # an en dash is not string.punctuation
        ("", ""),
    ],
)
def test_normalize_answer(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


def test_search_r1_examples() -> None:
    # em_check in Search-R1's verl/utils/reward_score/qa_em.py: any gold, after normalization
    assert exact_match("Beijing", ["beijing"]) == 1.0
    assert exact_match(" the Beatles. ", ["Beatles", "The Rolling Stones"]) == 1.0
    assert exact_match("Rolling Stones", ["Beatles", "The Rolling Stones"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0  # exact, not contains
    assert exact_match("Beijing", "Beijing") == 1.0  # a bare gold string, as em_check allows


def test_unicode_aliases() -> None:
    assert exact_match("são paulo", ("São Paulo",)) == 1.0
    assert exact_match("Sao Paulo", ("São Paulo",)) == 0.0  # accents count: list both spellings
    assert exact_match("Sao Paulo", ("São Paulo", "Sao Paulo")) == 1.0


def test_no_golds_scores_zero_and_version_is_set() -> None:
    assert exact_match("anything", ()) == 0.0
    assert VERIFIER_VERSION == "em-v1"
