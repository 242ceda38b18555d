"""search-v0 data: the GeoNames corpus, BM25 retrieval and its cache, the questions.

The BM25 index over the full corpus is built once per session into a temporary
$TAURL_CACHE (a path every search test module shares, so later modules load it).
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict

import bm25s
import pytest

from taurl.envs.core import Task
from taurl.envs.search import BM25Retriever, build_corpus, corpus_fingerprint, generate_tasks
from taurl.envs.search.corpus import Document, load_geo
from taurl.envs.search.questions import FAMILIES, HOLDOUT_PERCENT, country_splits, usable_cities
from taurl.envs.search.retriever import shared_retriever
from taurl.errors import ConfigError
from taurl.reward import normalize_answer


@pytest.fixture(scope="module")
def corpus() -> list[Document]:
    return build_corpus()


@pytest.fixture(scope="module")
def by_id(corpus) -> dict[str, Document]:
    return {d.doc_id: d for d in corpus}


@pytest.fixture(scope="module")
def retriever(taurl_cache) -> BM25Retriever:
    return shared_retriever()


@pytest.fixture(scope="module")
def tasks() -> dict[str, list[Task]]:
    return {s: generate_tasks(s) for s in ("train", "validation", "holdout")}


def _within(phrase: str, text: str) -> bool:
    return f" {phrase} " in f" {text} "


# -- corpus ------------------------------------------------------------------------------


def test_corpus_size_ids_and_order(corpus) -> None:
    kinds = Counter(d.kind for d in corpus)
    assert kinds["country"] == 252 and 30_000 <= kinds["city"] <= 40_000
    ids = [d.doc_id for d in corpus]
    assert len(set(ids)) == len(ids)
    assert ids[0] == "country:AD" and ids[kinds["country"]].startswith("city:")
    assert build_corpus() == corpus  # deterministic
    assert corpus_fingerprint(build_corpus()) == corpus_fingerprint(corpus)
    changed = [
        *corpus[:-1],
        Document(corpus[-1].doc_id, corpus[-1].title, corpus[-1].text + ".", "city"),
    ]
    assert corpus_fingerprint(changed) != corpus_fingerprint(corpus)


def test_documents_are_sentences_of_real_facts(by_id) -> None:
    lyon = by_id["city:2996944"]
    assert lyon.title == "Lyon"
    assert lyon.text.startswith("Lyon is a city in France. It has a population of ")
    assert "Its time zone is Europe/Paris." in lyon.text
    assert "It is the capital of France." in by_id["city:2988507"].text  # Paris
    assert "in the state of Missouri" in by_id["city:4408672"].text  # Sikeston, a US city
    fr = by_id["country:FR"].text
    for fact in (
        "France is a country in Europe.", "Its capital is Paris.",
        "Its currency is the Euro (EUR).", "Germany", "Its ISO codes are FR and FRA.", "+33", ".fr",
    ):
        assert fact in fr
    assert "It is also called US, USA and United States of America." in by_id["country:US"].text


# -- retrieval ---------------------------------------------------------------------------


def test_bm25_finds_cities_and_countries(retriever) -> None:
    assert retriever.search("Lyon", 3)[0].doc.doc_id == "city:2996944"
    assert retriever.search("In which country is the city of Qarchak?", 1)[0].doc.title == "Qarchak"
    assert retriever.search("Sao Tome", 1)[0].doc.title == "São Tomé"  # accent folding
    assert "country:FR" in [h.doc.doc_id for h in retriever.search("France currency", 3)]
    hits = retriever.search("Lyon", 5)
    assert len(hits) == 5 and all(
        a.score >= b.score > 0 for a, b in zip(hits, hits[1:], strict=False)
    )


@pytest.mark.parametrize("query", ["", "   \n\t", "the of and", "zzqxq", "?!", "é"])
def test_queries_without_known_words_return_nothing(retriever, query: str) -> None:
    assert retriever.search(query, 3) == []


def test_full_index_is_cached_and_reloaded(retriever, taurl_cache, corpus) -> None:
    assert retriever.index_dir.parent == taurl_cache / "bm25"
    assert retriever.index_dir.name.startswith(
        f"{corpus_fingerprint(corpus)}-bm25s{bm25s.__version__}"
    )
    again = BM25Retriever(corpus)
    assert again.loaded_from_cache
    assert [h.doc.doc_id for h in again.search("Lyon France", 5)] == [
        h.doc.doc_id for h in retriever.search("Lyon France", 5)
    ]


def test_cache_builds_once_then_loads_and_survives_corruption(tmp_path, corpus) -> None:
    docs = corpus[:300]
    first = BM25Retriever(docs, cache_dir=tmp_path)
    assert not first.loaded_from_cache and (first.index_dir / "params.index.json").exists()
    second = BM25Retriever(docs, cache_dir=tmp_path)
    assert second.loaded_from_cache
    assert second.search("Andorra", 3) == first.search("Andorra", 3)
    other = BM25Retriever(docs[:299], cache_dir=tmp_path)  # another corpus, another key
    assert not other.loaded_from_cache and other.index_dir != first.index_dir
    (first.index_dir / "params.index.json").write_text("{not json")
    rebuilt = BM25Retriever(docs, cache_dir=tmp_path)
    assert not rebuilt.loaded_from_cache and rebuilt.search("Andorra", 3) == first.search(
        "Andorra", 3
    )


def test_concurrent_searches_agree_with_serial(retriever) -> None:
    queries = [
        "Lyon", "France currency", "Tokyo", "Qarchak", "capital of Peru", "Europe/Paris",
    ] * 10
    expected = [[h.doc.doc_id for h in retriever.search(q, 3)] for q in queries]
    got: dict[int, list[str]] = {}

    def work(offset: int) -> None:
        for i in range(offset, len(queries), 6):
            got[i] = [h.doc.doc_id for h in retriever.search(queries[i], 3)]

    threads = [threading.Thread(target=work, args=(o,)) for o in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(queries))] == expected


def test_shared_retriever_is_one_per_process(retriever) -> None:
    assert shared_retriever() is retriever


# -- questions ---------------------------------------------------------------------------


def test_usable_cities_are_many_and_unambiguous(corpus) -> None:
    geo = load_geo()
    usable = usable_cities()
    assert len(usable) >= 4000
    counts = Counter(normalize_answer(d.title) for d in corpus)
    assert all(counts[normalize_answer(geo.cities[g]["name"])] == 1 for g in usable)


def test_families_and_task_shape(tasks, by_id) -> None:
    assert {f.hops for f in FAMILIES.values()} == {1, 2}
    for split, ts in tasks.items():
        assert Counter(t.metadata["family"] for t in ts).keys() == FAMILIES.keys()
        assert len({t.task_id for t in ts}) == len(ts)
        for t in ts:
            fam = FAMILIES[t.metadata["family"]]
            assert t.split == split and t.env == "search-v0" and t.answers
            assert t.metadata["hops"] == fam.hops and t.metadata["subject"] in t.prompt
            assert t.prompt == fam.template.format(subject=t.metadata["subject"])
            assert all(e in by_id for e in t.metadata["entities"])
    ex = next(
        t
        for ts in tasks.values()
        for t in ts
        if t.task_id == "search-v0/country_capital/country:CO"
    )
    assert ex.prompt == "What is the capital of Colombia?" and ex.answers == ("Bogota", "Bogotá")


def test_generate_tasks_is_deterministic_and_balanced() -> None:
    a = generate_tasks("train", n=70, seed=1)
    assert a == generate_tasks("train", n=70, seed=1) and a != generate_tasks("train", n=70, seed=2)
    assert set(Counter(t.metadata["family"] for t in a).values()) == {10}
    two = generate_tasks("holdout", n=9, families=["city_country_capital", "city_country_currency"])
    assert Counter(t.metadata["family"] for t in two) == {
        "city_country_capital": 5,
        "city_country_currency": 4,
    }
    with pytest.raises(ConfigError, match="did you mean 'city_country'"):
        generate_tasks("train", families=["city_contry"])
    with pytest.raises(ConfigError, match="split 'test' is unknown"):
        generate_tasks("test")


def test_two_hop_answers_need_the_bridge(tasks, by_id) -> None:
    for t in [t for s in tasks.values() for t in s if t.metadata["hops"] == 2][::97]:
        subject = normalize_answer(by_id[t.metadata["subject_id"]].text)
        bridge_id = t.metadata["entities"][1]
        bridge = normalize_answer(by_id[bridge_id].text)
        assert by_id[bridge_id].kind == "country" and by_id[bridge_id].title == t.metadata["bridge"]
        assert _within(normalize_answer(t.metadata["bridge"]), subject)  # subject doc -> bridge
        assert any(_within(normalize_answer(a), bridge) for a in t.answers)  # bridge doc -> answer
        assert not any(_within(normalize_answer(a), subject) for a in t.answers)  # not one hop


def test_one_hop_city_subjects_are_retrievable_by_name(tasks, retriever) -> None:
    held = tasks["validation"] + tasks["holdout"]
    sample = [t for t in held if t.metadata["family"] == "city_country"][::25]
    found = [
        t.metadata["subject_id"]
        in [h.doc.doc_id for h in retriever.search(t.metadata["subject"], 3)]
        for t in sample
    ]
    assert len(sample) > 100 and all(found)


def test_splits_are_by_country_and_entities_share_them(tasks) -> None:
    geo = load_geo()
    splits = country_splits()
    held = sum(s != "train" for s in splits.values()) / len(splits)
    assert abs(held - HOLDOUT_PERCENT / 100) < 0.05
    assert {"validation", "holdout"} <= set(splits.values())  # the held-out groups are split in two

    def country_of(entity: str) -> str:
        kind, key = entity.split(":")
        return key if kind == "country" else geo.cities[int(key)]["countrycode"]

    for split, ts in tasks.items():
        for t in ts:
            assert {splits[country_of(e)] for e in t.metadata["entities"]} == {split}
    # name groups
    assert splits["GN"] == splits["GQ"] == splits["PG"] and splits["SD"] == splits["SS"]


# Which answers name an entity (and so must not leak) and which are generic values that
# many entities share (a currency name, a continent, a time zone). A new answer kind
# fails here until it is classified.
ENTITY_ANSWER_KINDS = {"country", "city"}
GENERIC_ANSWER_KINDS = {"currency", "continent", "timezone"}


def _phrase_finder(train: list[Task]):
    """phrase -> whether some training question names it as whole words (word postings)."""
    texts = [normalize_answer(t.prompt) for t in train]
    postings: dict[str, set[int]] = defaultdict(set)  # word -> training questions that use it
    for i, text in enumerate(texts):
        for w in text.split():
            postings[w].add(i)

    def in_training_text(phrase: str) -> bool:
        lists = sorted((postings.get(w, set()) for w in phrase.split()), key=len)
        return any(_within(phrase, texts[i]) for i in set.intersection(*lists))
    return in_training_text


def test_holdout_never_leaks_into_training(tasks) -> None:
    """Neither held-out split (validation, holdout) leaks into training, and the two share
    no entity: tuning on validation never touches a holdout entity."""
    assert {f.answer_kind for f in FAMILIES.values()} <= ENTITY_ANSWER_KINDS | GENERIC_ANSWER_KINDS
    train, holdout = tasks["train"], tasks["validation"] + tasks["holdout"]
    val_entities = {e for t in tasks["validation"] for e in t.metadata["entities"]}
    assert not val_entities & {e for t in tasks["holdout"] for e in t.metadata["entities"]}
    train_entities = {e for t in train for e in t.metadata["entities"]}
    in_training_text = _phrase_finder(train)

    leaks = []
    for t in holdout:
        assert not set(t.metadata["entities"]) & train_entities, t.task_id
        phrases = {normalize_answer(t.metadata["subject"])}
        if FAMILIES[t.metadata["family"]].answer_kind in ENTITY_ANSWER_KINDS:
            phrases |= {normalize_answer(a) for a in t.answers}
        leaks += [(t.task_id, p) for p in phrases if p and in_training_text(p)]
    assert leaks == []
    assert len(holdout) > 10_000 and len(train) > 4 * len(holdout) * 0.8


def test_city_split_holds_out_cities_that_training_never_names() -> None:
    """split_by="city": unseen cities, countries shared as answer classes (module docstring
    of taurl.envs.search.questions)."""
    train, validation, test = (
        generate_tasks(s, split_by="city") for s in ("train", "validation", "holdout")
    )
    holdout = validation + test  # both held out; tuning on one never sees a city of the other
    assert not {t.metadata["subject_id"] for t in validation} & {
        t.metadata["subject_id"] for t in test
    }
    # country questions all train
    assert {t.metadata["subject_id"].split(":")[0] for t in holdout} == {"city"}
    held_cities = {t.metadata["subject_id"] for t in holdout}
    assert abs(len(held_cities) / len(usable_cities()) - HOLDOUT_PERCENT / 100) < 0.03
    in_training_text = _phrase_finder(train)
    train_answers = {
        normalize_answer(a)
        for t in train
        if FAMILIES[t.metadata["family"]].answer_kind in ENTITY_ANSWER_KINDS
        for a in t.answers
    }
    subjects = {normalize_answer(t.metadata["subject"]) for t in holdout}
    assert not [p for p in subjects if in_training_text(p)]  # never named by a training question
    assert not subjects & train_answers  # nor a training answer
    # the answer classes are shared: nearly every holdout city's country is a training answer
    cc = [t for t in holdout if t.metadata["family"] == "city_country"]
    assert len(cc) > 5_000
    assert sum(normalize_answer(t.answers[0]) in train_answers for t in cc) / len(cc) > 0.95
    with pytest.raises(ConfigError, match="split_by 'town' is unknown"):
        generate_tasks("train", split_by="town")
