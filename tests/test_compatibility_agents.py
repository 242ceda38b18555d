"""docs/compatibility.md's "Agent frameworks and model APIs" table is kept by the tests: every
``package==version`` it names is the installed version (the one the ecosystem tests ran),
and every package those tests import is in it."""

from __future__ import annotations

import re
from importlib import metadata

import pytest
from packaging.utils import canonicalize_name

import compat_doc
from compat_doc import DOC

SECTION = "## Agent frameworks and model APIs"
# the distributions tests/test_ecosystem_*.py and tests/test_proxy_apis.py run against
TESTED = (
    "openai-agents", "langgraph", "langchain-openai", "anthropic", "openai", "mcp",
    "mcp-server-time", "pydantic-ai-slim",
)


def section() -> str:
    return compat_doc.section(SECTION)


def pins() -> dict[str, str]:
    return compat_doc.pins(SECTION)


def test_the_tests_and_examples_it_cites_exist():
    cited = set(re.findall(r"`((?:tests|examples)/[\w/.-]+\.py)`", section()))
    assert cited and not [c for c in cited if not (DOC.parents[1] / c).exists()]


def test_the_table_names_every_tested_package():
    assert set(TESTED) <= set(pins()), (
        f"add a row for {sorted(set(TESTED) - set(pins()))} to {DOC.name}"
    )


def test_the_table_versions_are_the_installed_ones():
    missing, wrong = [], []
    for name, version in pins().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if installed != version:
            wrong.append(f"{name}: the table says {version}, installed {installed}")
    assert not wrong, f"update {DOC.name} after rerunning the ecosystem tests: {wrong}"
    if missing:  # as the ecosystem tests themselves skip without the extra
        pytest.skip(f"not installed (pip install 'taurl[ecosystem]'): {missing}")


def test_a_fresh_machine_installs_the_tabled_versions():
    """CI installs from requirements/lock.txt: a registry release after the table was written
    (anthropic 2.17.0 on the day 2.16.0 was tested) must not reach a fresh machine unnoticed."""
    import test_compatibility_envs

    lock = compat_doc.locked()
    tabled = {
        **pins(),
        **{p: test_compatibility_envs.pins()[p] for p in test_compatibility_envs.TESTED},
    }
    locked = {name: lock.get(canonicalize_name(name)) for name in tabled}
    drift = {
        name: (version, locked[name]) for name, version in tabled.items() if locked[name] != version
    }
    assert not drift, (
        f"table vs requirements/lock.txt (run `make lock` after the ecosystem tests pass): {drift}"
    )
