"""Train / validation / holdout by the content of a world, not by its seed.

Two seeds can draw the same world (a 4x4 FrozenLake map with no hole comes up about once in
twenty draws), so splitting seeds would leak holdout maps into training. Instead each world
is keyed by a canonical text of its content (the map rows; a taxi start state) and the
key's hash picks the split:

    u = blake2b(key) / 2^64  ∈ [0, 1)
    split = train if u < f_train, validation if u < f_train + f_validation, else holdout

so a world belongs to exactly one split whatever seed drew it, and the splits are
disjoint by construction. Tasks are drawn by walking a seeded stream of candidate worlds
(the same stream for every split) and keeping those of the requested split.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from taurl.errors import ConfigError

SPLITS = ("train", "validation", "holdout")
W = TypeVar("W")


def content_hash(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def split_of(key: str, fractions: tuple[float, float, float]) -> str:
    """The split of the world whose canonical text is `key` (module docstring)."""
    u = int(content_hash(key), 16) / 2**64
    if u < fractions[0]:
        return "train"
    return "validation" if u < fractions[0] + fractions[1] else "holdout"


def derive_seed(*parts: object) -> int:
    """A 32-bit seed from `parts` (stable across processes, unlike hash())."""
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(),
                                          digest_size=4).digest(), "little")


def draw(split: str, n: int, candidates: Iterator[tuple[int, W]], key: Callable[[W], str],
         fractions: tuple[float, float, float], *, distinct: bool, max_draws: int,
         what: str) -> list[tuple[int, W]]:
    """The first `n` (candidate seed, world) of `split` from `candidates`; with `distinct`,
    each world at most once. Raises when `max_draws` candidates do not supply `n`."""
    if split not in SPLITS:
        raise ConfigError(f"split {split!r} is unknown; use one of {SPLITS}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"n must be an integer >= 0, got {n!r}")
    out: list[tuple[int, W]] = []
    seen: set[str] = set()
    draws = 0
    for seed, world in candidates:
        if len(out) >= n or draws >= max_draws:
            break
        draws += 1
        k = key(world)
        if split_of(k, fractions) != split or (distinct and k in seen):
            continue
        seen.add(k)
        out.append((seed, world))
    if len(out) < n:
        raise ConfigError(f"only {len(out)} {'distinct ' if distinct else ''}{what} of split "
                          f"{split!r} in {draws} draws, {n} asked for; ask for fewer tasks (or a "
                          "larger world)")
    return out
