"""Seeds of the rollout: one per episode (from its names), one per sampled action.

Both are pure functions of their inputs, stable across processes and machines (unlike
``hash()``), so a resumed or re-run round draws exactly what the first run drew.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any


def episode_seed(*parts: Any) -> int:
    """A 31-bit seed fixed by `parts` (stable across processes, unlike hash())."""
    return random.Random(":".join(map(str, parts))).getrandbits(31)


def _derive_seed(seed: int, turn: int, piece: int = 0) -> int:
    """The sampling seed of `turn`'s action; piece k >= 1: its continuation after the k-th
    abort (a partial rollout). Keyed by both, so no continuation reuses another turn's seed."""
    key = f"{seed}:{turn}" if piece == 0 else f"{seed}:{turn}:{piece}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "little")
