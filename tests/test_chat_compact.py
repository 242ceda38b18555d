"""chat_template: chatml-compact — tools as one-line signatures for a from-scratch tiny policy."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from taurl.errors import ConfigError
from taurl.policy.tokenizer import (
    CHAT_TEMPLATE,
    CHAT_TEMPLATE_COMPACT,
    build_tokenizer,
    save_tokenizer,
)
from taurl.recipe.config import TrainConfig
from taurl.rollout.loop import ChatCodec

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search an encyclopedia of cities and countries.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
            "required": ["query"],
        },
    },
}
CALL = {"type": "function", "function": {"name": "search", "arguments": '{"query": "Lyon"}'}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "In which country is Lyon?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": "Lyon is a city in France."},
    {"role": "assistant", "content": "<answer>France</answer>"},
]


@pytest.fixture(scope="module")
def toks():
    texts = ["In which country is Lyon? Lyon is a city in France. Search an encyclopedia."] * 20
    return build_tokenizer(texts, 400), build_tokenizer(texts, 400, chat_template="chatml-compact")


def test_tools_render_as_signatures_and_the_rest_is_chatml(toks):
    _, compact = toks
    text = compact.apply_chat_template(
        CONVERSATION[:2], tools=[SEARCH], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nBe brief.\n\n<tools>\n"
        "search(query: string, k: integer): Search an encyclopedia of cities and countries.\n"
        "</tools><|im_end|>\n<|im_start|>user\nIn which country is Lyon?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # without tools, and for every message after the tools block, the two templates agree
    for msgs in (CONVERSATION, CONVERSATION[1:]):
        assert compact.apply_chat_template(msgs, tokenize=False) == toks[0].apply_chat_template(
            msgs, tokenize=False
        )
    long = toks[0].apply_chat_template(CONVERSATION, tools=[SEARCH], tokenize=False)
    short = compact.apply_chat_template(CONVERSATION, tools=[SEARCH], tokenize=False)
    assert long.split("<|im_start|>user", 1)[1] == short.split("<|im_start|>user", 1)[1]


def test_renderings_stay_append_only_so_the_capture_can_extend_by_deltas(toks):
    _, compact = toks
    codec = ChatCodec(compact, [SEARCH])
    for k in range(2, len(CONVERSATION)):
        head = codec.render(CONVERSATION[:k], add_generation_prompt=False)
        assert codec.render(CONVERSATION[:k + 1], add_generation_prompt=False).startswith(head)


def test_the_prompt_is_a_fraction_of_the_hermes_preamble_s(toks):
    full, compact = toks
    n = [
        len(
            t.apply_chat_template(
                CONVERSATION[1:2], tools=[SEARCH], add_generation_prompt=True, tokenize=True
            )["input_ids"]
        )
        for t in (full, compact)
    ]
    assert n[1] * 3 < n[0], n


def test_the_template_is_saved_and_checked(toks, tmp_path):
    save_tokenizer(toks[1], tmp_path)
    assert (
        AutoTokenizer.from_pretrained(tmp_path).chat_template
        == CHAT_TEMPLATE_COMPACT
        != CHAT_TEMPLATE
    )
    with pytest.raises(ConfigError, match="chat_template 'hermes' is not one of"):
        build_tokenizer(["a b c"] * 10, 400, chat_template="hermes")
    assert any("chat_template must be chatml or chatml-compact" in p
               for p in TrainConfig(chat_template="compact").problems())
