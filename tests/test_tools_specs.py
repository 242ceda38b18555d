"""Tool specs: JSON Schema from typed functions, and argument validation."""

from __future__ import annotations

from typing import Literal

import pytest

from taurl.envs.checker import check_tool
from taurl.errors import ConfigError
from taurl.tools import function_spec, tool, validate_arguments


def grep(
    pattern: str, files: list[str], max_hits: int = 10, mode: Literal["fast", "exact"] = "fast",
    note: str | None = None,
) -> str:
    """Search files for a pattern.

    Longer explanation that is not part of the description.

    Args:
        pattern: A regular expression,
            continued on a second line.
        files: Paths to search.
        max_hits: Stop after this many matches.
        mode: How to match.
        note: Anything.

    Returns:
        The matching lines.
    """
    return ""


async def fetch(url: str, retries: int = 2) -> dict:
    """Fetch a URL."""
    return {}


def test_schema_from_signature_and_docstring():
    spec = function_spec(grep)
    decl = spec.openai()
    check_tool(decl)  # the env checker accepts it
    fn = decl["function"]
    assert fn["name"] == "grep" and fn["description"] == "Search files for a pattern."
    props = fn["parameters"]["properties"]
    assert props["pattern"] == {"type": "string",
                                "description": "A regular expression, continued on a second line."}
    assert props["files"]["type"] == "array" and props["files"]["items"] == {"type": "string"}
    assert props["max_hits"]["type"] == "integer"
    assert props["mode"]["enum"] == ["fast", "exact"]
    assert props["note"]["type"] == ["string", "null"]
    assert fn["parameters"]["required"] == ["pattern", "files"]
    assert fn["parameters"]["additionalProperties"] is False
    assert not spec.is_async and spec.scopes == frozenset({"read"})


def test_async_tool_and_decorator_options():
    spec = tool(scopes=("network",), cost=0.5, timeout_s=3)(fetch)
    assert (
        spec.is_async
        and spec.scopes == frozenset({"network"})
        and spec.cost == 0.5
        and spec.timeout_s == 3
    )
    assert spec.parameters["required"] == ["url"]
    assert tool(fetch).name == "fetch"
    capped = tool(fetch, max_string_chars=10)
    assert capped.parameters["properties"]["url"]["maxLength"] == 10


def test_bad_declarations_list_every_problem():
    def bad(a, *rest, b: set[int], **kw) -> None:  # no docstring, untyped, varargs, set
        pass

    with pytest.raises(ConfigError) as e:
        function_spec(bad, scopes=("root",))
    text = str(e.value)
    for needle in (
        "unknown scope", "no docstring", "'a' needs a type annotation", "*rest", "'b'", "**kw",
    ):
        assert needle in text
    with pytest.raises(ConfigError, match="name"):
        function_spec(fetch, name="has space")


@pytest.mark.parametrize(
    ("args", "problems"),
    [
        ({"pattern": "x", "files": ["a"]}, []),
        ({"pattern": "x", "files": ["a"], "note": None, "max_hits": 3, "mode": "exact"}, []),
        ({"files": ["a"]}, ["missing required argument 'pattern'"]),
        ({"pattern": 3, "files": ["a"]}, ["argument 'pattern' must be a string, got integer"]),
        ({"pattern": "x", "files": "a"}, ["argument 'files' must be an array, got string"]),
        ({"pattern": "x", "files": [1]}, ["argument 'files'[0] must be a string, got integer"]),
        (
            {"pattern": "x", "files": [], "max_hits": True},
            ["argument 'max_hits' must be an integer, got boolean"],
        ),
        (
            {"pattern": "x", "files": [], "max_hits": 1.5},
            ["argument 'max_hits' must be an integer, got number"],
        ),
        (
            {"pattern": "x", "files": [], "mode": "slow"},
            ["argument 'mode' must be one of ['fast', 'exact'], got 'slow'"],
        ),
        (
            {"pattern": "x", "files": [], "extra": 1},
            [
                "unknown argument(s) ['extra']; this tool takes "
                "['files', 'max_hits', 'mode', 'note', 'pattern']"
            ],
        ),
        (["x"], ['"arguments" must be a JSON object, got array']),
    ],
)
def test_validate_arguments(args, problems):
    assert validate_arguments(args, function_spec(grep).parameters) == problems


def test_max_length_and_numbers():
    params = tool(fetch, max_string_chars=5).parameters
    assert validate_arguments({"url": "x" * 6}, params) == [
        "argument 'url' is 6 characters long; the limit is 5"
    ]

    def area(w: float) -> float:
        """Area."""
        return w

    assert validate_arguments({"w": 2}, function_spec(area).parameters) == []  # an int is a number
