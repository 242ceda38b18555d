"""Questions about the corpus, with gold answers, split by entity with no leakage.

Families (`FAMILIES`): five one-hop templates and two two-hop ones. A two-hop question
names a city and asks about its country: the city's document names the country (the
*bridge*), and only the country's document holds the answer, so it takes two searches.

Usable cities: only cities whose name is unique in the corpus (after accent folding and
answer normalization), is not also a country, US-state or continent name, is not a
phrase of a question template ("Of" is a Turkish town) and has a searchable word. That
leaves tens of thousands, far more than a tiny model can memorize (~250), so it must
learn to copy from what it retrieves.

Splits, by entity, in one of two granularities (`SPLIT_BY`):

- ``"country"`` (the default; nothing about a holdout task was seen in training):
  countries are grouped (a country whose name contains another's as whole words joins it:
  Guinea / Equatorial Guinea / Papua New Guinea, Sudan / South Sudan) and each group goes
  is held out when ``sha256(SPLIT_SEED:code) mod 100 < HOLDOUT_PERCENT`` (its smallest
  ISO code), else "train"; a held-out group is "validation" or "holdout" by a second hash
  (``sha256(SPLIT_SEED:validation:code) mod 100 < VALIDATION_PERCENT``), so the two never
  share an entity and tuning on validation never touches a holdout entity. Every city follows its
  country, so a task's subject, bridge and answer entities all share one split. A training question
  whose text still names a holdout entity (the subject or an entity answer of a holdout task, as
  whole words, e.g. the town "Nueva Guinea" when Guinea is held out) is dropped. Holdout answers are
  then names the policy never wrote in training.
- ``"city"`` (new subjects, shared answer classes): a city-subject task is held out when
  ``sha256(SPLIT_SEED:city:<geonames id>) mod 100 < HOLDOUT_PERCENT`` (validation or
  holdout by the same second hash); every
  country-subject task is a training task. A holdout city is never named by a training
  question nor is it a training answer (a training "capital of France? Paris" would leak
  the holdout "country of Paris?"). Countries and capitals are answer *classes* shared by
  both splits (training cities of France teach that "France" is an answer).
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from taurl.envs.core import Task, task_request_problems
from taurl.envs.search import distractors as distractors_family
from taurl.envs.search.corpus import Geo, city_text, fold, load_geo
from taurl.envs.search.retriever import tokenize
from taurl.errors import ConfigError
from taurl.reward.exact_match import normalize_answer

ENV_NAME = "search-v0"
SPLITS = ("train", "validation", "holdout")
SPLIT_BY = ("country", "city")
SPLIT_SEED = "taurl-search-v0"
HOLDOUT_PERCENT = 20  # share of entities held out of training (validation + holdout)
VALIDATION_PERCENT = 50  # share of the held-out entities that form the validation split
# answers that name an entity; the rest are generic
ENTITY_ANSWER_KINDS = frozenset({"country", "city"})


@dataclass(frozen=True)
class Family:
    """A question template. subject_kind / answer_kind: what the question names / asks for."""

    name: str
    hops: int
    subject_kind: str  # "city" | "country"
    answer_kind: str  # "country" | "city" | "timezone" | "currency" | "continent"
    template: str  # with a {subject} slot


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("city_country", 1, "city", "country", "In which country is the city of {subject}?"),
    Family("city_timezone", 1, "city", "timezone",
           "What is the time zone of the city of {subject}?"),
    Family("country_capital", 1, "country", "city", "What is the capital of {subject}?"),
    Family("country_currency", 1, "country", "currency", "What currency is used in {subject}?"),
    Family("country_continent", 1, "country", "continent", "On which continent is {subject}?"),
    Family("city_country_capital", 2, "city", "city", "What is the capital of the country where "
                                                      "the city of {subject} lies?"),
    Family("city_country_currency", 2, "city", "currency", "What currency is used in the country "
                                                           "where the city of {subject} lies?"),
)}


# names repeat across families (a city is the subject of four): normalize each once
_norm = functools.lru_cache(maxsize=None)(normalize_answer)


def _key(name: str) -> str:
    """The form names are compared in: accent-folded, then answer-normalized."""
    return _norm(fold(name))


def _hash_percent(code: str) -> int:
    return int(hashlib.sha256(f"{SPLIT_SEED}:{code}".encode()).hexdigest()[:8], 16) % 100


def _held_split(code: str) -> str:
    """"train", or for a held-out entity "validation" | "holdout" by a second, independent hash."""
    if _hash_percent(code) >= HOLDOUT_PERCENT:
        return "train"
    return "validation" if _hash_percent(f"validation:{code}") < VALIDATION_PERCENT else "holdout"


def _within(phrase: str, text: str) -> bool:
    """`phrase` occurs in `text` as whole words (both already normalized)."""
    return bool(phrase) and f" {phrase} " in f" {text} "


def _country_names(geo: Geo, code: str) -> list[str]:
    return [geo.countries[code]["name"], *geo.country_aliases[code]]


@functools.lru_cache(maxsize=1)
def country_splits() -> dict[str, str]:
    """ISO code -> "train" | "validation" | "holdout" (see the module docstring)."""
    geo = load_geo()
    codes = sorted(geo.countries)
    parent = {c: c for c in codes}

    def root(c: str) -> str:
        while parent[c] != c:
            c = parent[c]
        return c

    keys = {c: [_key(n) for n in _country_names(geo, c)] for c in codes}
    for a in codes:
        for b in codes:
            if a != b and any(_within(ka, kb) for ka in keys[a] for kb in keys[b]):
                ra, rb = root(a), root(b)
                parent[max(ra, rb)] = min(ra, rb)  # the group is named by its smallest code
    return {c: _held_split(root(c)) for c in codes}


def _template_phrases() -> set[str]:
    """Every run of whole words in the templates' fixed text (no city may be named so)."""
    out = set()
    for f in FAMILIES.values():
        words = normalize_answer(f.template.replace("{subject}", " ")).split()
        out.update(" ".join(words[i:j]) for i in range(len(words))
                   for j in range(i + 1, len(words) + 1))
    return out


@functools.lru_cache(maxsize=1)
def usable_cities() -> tuple[int, ...]:
    """GeoNames ids of the cities questions may name, ascending (module docstring)."""
    geo = load_geo()
    counts = Counter(_key(c["name"]) for c in geo.cities.values())
    reserved = {_key(n) for code in geo.countries for n in _country_names(geo, code)}
    reserved |= {_key(n) for n in (*geo.us_states.values(), *geo.continents.values())}
    reserved |= _template_phrases()
    return tuple(gid for gid in sorted(geo.cities)
                 if counts[k := _key(geo.cities[gid]["name"])] == 1 and k and k not in reserved
                 and tokenize(geo.cities[gid]["name"]))


def _dedupe(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n for n in names if n))


def _capital_answers(geo: Geo, code: str) -> tuple[str, ...]:
    gid = geo.capital_city.get(code)
    return _dedupe([geo.countries[code]["capital"], geo.cities[gid]["name"] if gid else ""])


def _country_facts(geo: Geo, code: str) -> dict[str, tuple[tuple[str, ...], list[str]]]:
    """answer kind -> (gold aliases, extra entity ids) for questions about country `code`."""
    c = geo.countries[code]
    cap = geo.capital_city.get(code)
    return {
        "country": (_dedupe(_country_names(geo, code)), []),
        "city": (_capital_answers(geo, code) if c["capital"] else (),
                 [f"city:{cap}"] if cap else []),
        "currency": (_dedupe([c["currencyname"], c["currencycode"]]) if c["currencyname"] else (),
                     []),
        "continent": (_dedupe([geo.continents.get(c["continentcode"], "")]), []),
    }


def _make(fam: Family, subject: str, subject_id: str, answers: tuple[str, ...],
          entities: list[str], split: str, bridge: str | None = None) -> Task:
    meta = {"family": fam.name, "hops": fam.hops, "entities": list(dict.fromkeys(entities)),
            "subject": subject, "subject_id": subject_id, "answer_kind": fam.answer_kind}
    if bridge is not None:
        meta["bridge"] = bridge
    return Task(task_id=f"{ENV_NAME}/{fam.name}/{subject_id}",
                prompt=fam.template.format(subject=subject),
                answers=answers, split=split, env=ENV_NAME, metadata=meta)


def _all_tasks(split_by: str) -> list[Task]:
    """Every task, before the leakage filter, in canonical order."""
    geo, splits = load_geo(), country_splits()
    capital_of = {gid: geo.countries[code]["name"] for code, gid in geo.capital_city.items()}
    facts = {code: _country_facts(geo, code) for code in geo.countries}
    subject_docs: dict[int, str] = {}  # normalized city documents, for the 2-hop check
    tasks = []
    for fam in FAMILIES.values():
        if fam.subject_kind == "country":
            for code in sorted(geo.countries):
                answers, extra = facts[code][fam.answer_kind]
                # city mode holds out cities only
                split = splits[code] if split_by == "country" else "train"
                if answers:
                    tasks.append(_make(fam, geo.countries[code]["name"], f"country:{code}", answers,
                                       [f"country:{code}", *extra], split))
            continue
        for gid in usable_cities():
            city, code = geo.cities[gid], geo.cities[gid]["countrycode"]
            ids = [f"city:{gid}", f"country:{code}"]
            if fam.hops == 1 and fam.answer_kind == "timezone":
                answers = _dedupe([city["timezone"], city["timezone"].replace("_", " ")])
            elif fam.hops == 1:  # city -> its country
                answers = facts[code]["country"][0]
            else:
                answers, extra = facts[code][fam.answer_kind]
                if gid not in subject_docs:
                    subject_docs[gid] = normalize_answer(city_text(gid, geo, capital_of))
                # a capital is its own answer, and an answer already in the subject's
                # document would make the question one-hop: skip both
                if not answers or gid == geo.capital_city.get(code) or any(
                        _within(_norm(a), subject_docs[gid]) for a in answers):
                    continue
                ids += extra
            split = splits[code] if split_by == "country" else _city_split(gid)
            tasks.append(_make(fam, city["name"], f"city:{gid}", answers, ids, split,
                               bridge=geo.countries[code]["name"] if fam.hops == 2 else None))
    return tasks


def _city_split(gid: int) -> str:
    return _held_split(f"city:{gid}")


def _entity_phrases(task: Task) -> set[str]:
    """What a holdout task must not leak: its subject and, for entity answers, its golds."""
    out = {_norm(task.metadata["subject"])}
    if task.metadata["answer_kind"] in ENTITY_ANSWER_KINDS:
        out |= {_norm(a) for a in task.answers}
    return out - {""}


@functools.cache
def _task_pool(split_by: str = "country") -> dict[str, dict[str, list[Task]]]:
    """split -> family -> tasks, after dropping training tasks that leak holdout entities
    (module docstring: what may not leak depends on `split_by`)."""
    tasks = _all_tasks(split_by)
    # a holdout entity named like template words would ban every training question: such
    # holdout tasks go instead (none today: usable cities already exclude those names)
    fixed = _template_phrases()
    tasks = [t for t in tasks if t.split == "train" or not _entity_phrases(t) & fixed]
    # validation and holdout: neither may leak into training
    held = [t for t in tasks if t.split != "train"]
    if split_by == "country":
        banned = set().union(*(_entity_phrases(t) for t in held))
        banned_answers: set[str] = set()
    else:  # every holdout task is about a city: its name may be neither asked about nor answered
        banned = banned_answers = {_norm(t.metadata["subject"]) for t in held}
    prefixes = {" ".join(p.split()[:i]) for p in banned for i in range(1, len(p.split()) + 1)}
    pool: dict[str, dict[str, list[Task]]] = {s: {f: [] for f in FAMILIES} for s in SPLITS}
    for t in tasks:
        if t.split == "train" and (
                _names_any(normalize_answer(t.prompt).split(), banned, prefixes)
                or (t.metadata["answer_kind"] in ENTITY_ANSWER_KINDS
                    and any(_norm(a) in banned_answers for a in t.answers))):
            continue
        pool[t.split][t.metadata["family"]].append(t)
    return pool


def _names_any(words: list[str], phrases: set[str], prefixes: set[str]) -> bool:
    """Whether some run of `words` is in `phrases`; `prefixes` (every word-prefix of a
    phrase) stops each scan as soon as no phrase can start that way."""
    for i in range(len(words)):
        for j in range(i + 1, len(words) + 1):
            run = " ".join(words[i:j])
            if run in phrases:
                return True
            if run not in prefixes:
                break
    return False


@functools.cache
def _distractor_pool(split_by: str, split: str, k: int) -> tuple[Task, ...]:
    """The split's ``city_distractors_capital`` tasks with `k` distractors each."""
    return tuple(distractors_family.distractor_tasks(
        _task_pool(split_by)[split][distractors_family.BASE_FAMILY], k))


def generate_tasks(split: str, n: int | None = None, seed: int = 0,
                   families: Iterable[str] | None = None, split_by: str = "country",
                   distractors: int = 8) -> list[Task]:
    """Up to `n` tasks of `split` (all when n is None), balanced across `families`;
    `split_by` is the holdout granularity, "country" or "city" (module docstring).
    `distractors`: cities named beside the subject by the opt-in family
    ``city_distractors_capital`` (`taurl.envs.search.distractors`; None picks `FAMILIES` only).

    Each family's tasks are shuffled with `seed` and the families are interleaved round
    robin, so any prefix is balanced until a family runs out (the country families hold
    ~200 tasks each, the city families thousands). Same arguments, same list.
    """
    names, problems = task_request_problems(split, SPLITS,
                                            list(FAMILIES) if families is None else families,
                                            [*FAMILIES, distractors_family.FAMILY], n,
                                            n_may_be_none=True)
    if split_by not in SPLIT_BY:
        problems.append(f"split_by {split_by!r} is unknown; use one of {SPLIT_BY}")
    if distractors_family.FAMILY in names:
        problems += distractors_family.check_distractors(distractors)
    if problems:
        raise ConfigError(problems)
    pool = _task_pool(split_by)[split]
    queues = []
    for f in names:
        tasks = list(pool[f] if f != distractors_family.FAMILY
                     else _distractor_pool(split_by, split, distractors))
        random.Random(f"{seed}:{f}").shuffle(tasks)
        queues.append(tasks)
    out: list[Task] = []
    limit = sum(map(len, queues)) if n is None else n
    for i in range(max(map(len, queues))):
        out.extend(q[i] for q in queues if i < len(q))
        if len(out) >= limit:
            break
    return out[:limit]
