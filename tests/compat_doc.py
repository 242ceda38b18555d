"""docs/compatibility.md read by the tests that keep it: one section, and the
``package==version`` pins of its tables."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.utils import canonicalize_name

DOC = Path(__file__).resolve().parents[1] / "docs" / "compatibility.md"


def section(heading: str) -> str:
    text = DOC.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end > 0 else None]


def pins(heading: str) -> dict[str, str]:
    table = "\n".join(line for line in section(heading).splitlines() if line.startswith("|"))
    return dict(re.findall(r"`([A-Za-z0-9_.-]+)==([^`]+)`", table))


LOCK = DOC.parents[1] / "requirements" / "lock.txt"


def locked() -> dict[str, str]:
    """requirements/lock.txt's ``name==version`` lines (what `make test` installs on
    a fresh machine)."""
    lines = (
        line.split("==")
        for line in LOCK.read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    return {canonicalize_name(name.strip()): version.strip() for name, version in lines}
