"""Tool-call parsers: Hermes JSON and XML tags; every failure is a ParseResult, never a raise."""

from __future__ import annotations

import pytest

from taurl.policy import build_tokenizer
from taurl.tools import ToolCall, function_spec, parse_hermes, parse_xml
from taurl.tools.parsers import parse_hermes_or_json


def write_file(path: str, content: str) -> str:
    """Write a file."""
    return ""


def search(query: str) -> str:
    """Search."""
    return ""


def sleep(seconds: float, loud: bool = False) -> str:
    """Sleep."""
    return ""


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>', [("a", {"x": 1})]),
        ('think first\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>', [("a", {})]),
        ('<tool_call>{"name": "a"}</tool_call>', [("a", {})]),  # arguments omitted
        # OpenAI wire form
        ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 2}"}</tool_call>', [("a", {"x": 2})]),
        (
            '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", '
            '"arguments": {}}</tool_call>',
            [("a", {}), ("b", {})],
        ),
    ],
)
def test_hermes_ok(text, calls):
    r = parse_hermes(text)
    assert r.ok and r.error is None and [(c.name, c.arguments) for c in r.calls] == calls


@pytest.mark.parametrize(
    ("text", "kind", "says"),
    [
        ("I will just answer.", "no_call", "no tool call found"),
        ('<tool_call>{"name": "a", "arguments": {}}', "malformed", "not closed"),
        (
            "<tool_call>{name: a}</tool_call>",
            "malformed",
            "not valid JSON (Expecting property name",
        ),
        ("<tool_call>[1, 2]</tool_call>", "malformed", "got a JSON list"),
        ('<tool_call>{"arguments": {}}</tool_call>', "malformed", 'no "name"'),
        (
            '<tool_call>{"name": "a", "arguments": [1]}</tool_call>',
            "malformed",
            '"arguments" must be a JSON object',
        ),
        (
            '<tool_call>{"name": "a", "arguments": "nope"}</tool_call>',
            "malformed",
            "not a JSON object",
        ),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "malformed", "JSON"),
        (
            '<tool_call>{"name": "a", "arguments": {"x": "' + "y" * 300_000 + '"}}</tool_call>',
            "too_long",
            "limit",
        ),
    ],
)
def test_hermes_failures_explain(text, kind, says):
    r = parse_hermes(text)
    assert not r.ok and r.kind == kind and says in r.error and r.calls == ()
    if kind != "too_long":
        assert "<tool_call>" in r.error  # the model is shown the right form


def test_xml_one_argument_and_children():
    tools = {s.name: s.parameters for s in map(function_spec, (write_file, search, sleep))}
    r = parse_xml("<think>hm</think><search> Lyon </search>", tools)
    assert r.calls == (ToolCall("search", {"query": "Lyon"}, "<search> Lyon </search>"),)
    r = parse_xml("<write_file><path>a.py</path><content>x = 1\n</content></write_file>", tools)
    assert r.calls[0].arguments == {"path": "a.py", "content": "x = 1"}
    r = parse_xml("<sleep><seconds>1.5</seconds><loud>true</loud></sleep>", tools)
    assert r.calls[0].arguments == {"seconds": 1.5, "loud": True}  # decoded as the schema wants
    assert parse_xml("<search>x", tools).kind == "malformed"
    assert parse_xml("<lookup>x</lookup>", tools).kind == "no_call"


def test_hermes_format_matches_the_chat_template():
    """A call rendered by the chat template (assistant tool_calls) parses back to itself."""
    tok = build_tokenizer(["a tool call template text"], vocab_size=400)
    call = {
        "type": "function",
        "function": {"name": "write_file", "arguments": {"path": "a.py", "content": "é\n"}},
    }
    text = tok.apply_chat_template(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ],
        tokenize=False,
    )
    r = parse_hermes(text)
    assert (
        r.ok
        and r.calls[0].name == "write_file"
        and r.calls[0].arguments == {"path": "a.py", "content": "é\n"}
    )


# The untagged forms Qwen2.5-Coder-0.5B-Instruct wrote zero-shot on code-v0 (docs/models.md)
FENCED = '```json\n{"name": "run_tests", "arguments": {}}\n```'
PY_FENCED = ('```python\n{\n    "name": "write_file",\n    "arguments": {\n'
             '        "path": "solution.py", "content": "x = 1\n"\n    }\n}\n```')


@pytest.mark.parametrize(("text", "calls"), [
    (FENCED, [("run_tests", {})]),
    (PY_FENCED, [("write_file", {"path": "solution.py", "content": "x = 1\n"})]),  # raw newline
    ('{"name": "submit", "arguments": {}}', [("submit", {})]),  # bare
    ('ok: {"name": "a", "parameters": {"x": 1}} then {"name": "b", "arguments": "{}"}',
     [("a", {"x": 1}), ("b", {})]),
    ('{"plan": {"name": "a", "arguments": {}}}', [("a", {})]),  # inside another object
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call> {"name": "b", "arguments": {}}',
     [("a", {})]),  # a tag present: the tagged calls only
])
def test_hermes_or_json_takes_untagged_calls(text, calls):
    r = parse_hermes_or_json(text)
    assert r.ok and [(c.name, c.arguments) for c in r.calls] == calls
    assert parse_hermes(text).kind == ("ok" if "<tool_call>" in text else "no_call")


@pytest.mark.parametrize(("text", "kind"), [
    ("```python\ndef f(x):\n    return {1: 2}\n```", "no_call"),  # code, not a call
    ('{"name": "a"}', "no_call"),  # no "arguments": a record, not a call
    ('{"name": "a", "arguments": [1]}', "malformed"),
    ('<tool_call>{"name": "a", "arguments": {}}', "malformed"),  # the tagged error stands
])
def test_hermes_or_json_failures(text, kind):
    r = parse_hermes_or_json(text, example="EXAMPLE")
    assert not r.ok and r.kind == kind and "EXAMPLE" in r.error
