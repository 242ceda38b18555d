"""docs/compatibility.md's "Environment standards" table is kept by the tests: every
``package==version`` it names is the installed version (the one the adapters' tests ran),
each adapter's package has a row, and the tests it cites exist."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "compatibility.md"
SECTION = "## Environment standards"
TESTED = ("reasoning-gym", "openenv-core", "verifiers")  # tests/test_env_{reasoning_gym,openenv,verifiers}.py


def section() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end > 0 else None]


def pins() -> dict[str, str]:
    table = "\n".join(line for line in section().splitlines() if line.startswith("|"))
    return dict(re.findall(r"`([A-Za-z0-9_.-]+)==([^`]+)`", table))


def test_every_adapter_package_has_a_row_and_cited_tests_exist():
    assert set(TESTED) <= set(pins()), f"add a row for {sorted(set(TESTED) - set(pins()))}"
    cited = set(re.findall(r"`(tests/[\w/.-]+\.py)`", section()))
    assert cited and not [c for c in cited if not (DOC.parents[1] / c).exists()]


@pytest.mark.parametrize("package", TESTED)
def test_the_table_names_the_installed_version(package):
    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed (pip install 'taurl[ecosystem]')")
    assert pins()[package] == installed, (f"docs/compatibility.md says {package}=={pins()[package]}, the suite ran "
                                          f"{installed}: update the row after rerunning its tests")
