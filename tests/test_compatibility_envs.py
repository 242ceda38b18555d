"""docs/compatibility.md's "Environment standards" table is kept by the tests: every
``package==version`` it names is the installed version (the one the adapters' tests ran),
each adapter's package has a row, and the tests it cites exist."""

from __future__ import annotations

import re
from importlib import metadata

import pytest

import compat_doc
from compat_doc import DOC

SECTION = "## Environment standards"
# tests/test_env_{reasoning_gym,openenv,verifiers}.py
TESTED = ("reasoning-gym", "openenv-core", "verifiers")


def section() -> str:
    return compat_doc.section(SECTION)


def pins() -> dict[str, str]:
    return compat_doc.pins(SECTION)


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
    assert pins()[package] == installed, (
        f"docs/compatibility.md says {package}=={pins()[package]}, the suite ran "
        f"{installed}: update the row after rerunning its tests"
    )
