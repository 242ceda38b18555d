"""The engine's slim decode path (taurl.policy.slim_decode): the model's own numbers, checked
at the first decode step, and the model's forward wherever it does not apply or disagrees."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from taurl.policy import slim_decode
from taurl.policy.engine import LocalEngine, SamplingParams
from taurl.policy.kv_cache import BatchKV
from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import create_policy
from taurl.policy.slim_decode import SlimDecoder
from taurl.policy.tokenizer import build_tokenizer

TEXTS = [f"Town{i} lies in Country{i % 13}; {i * 7} people live there." for i in range(300)]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(TEXTS, vocab_size=500)


def _prompts(n, seed=0, vocab=400):
    rng = random.Random(seed)
    return [[rng.randrange(20, vocab) for _ in range(rng.randint(3, 30))] for _ in range(n)]


def _generate(engine, prompts, **kw):
    async def main():
        return await asyncio.gather(
            *[
                engine.generate(p, SamplingParams(max_tokens=12, seed=i, temperature=0.9, **kw))
                for i, p in enumerate(prompts)
            ]
        )
    return asyncio.run(main())


def _llama(vocab=500):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        pad_token_id=0,
        eos_token_id=1,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("build", ["qwen2", "llama3"])
def test_slim_path_serves_and_its_logprobs_are_the_models(tok, build):
    model = create_policy(tok, "tiny", seed=0) if build == "qwen2" else _llama()
    prompts = _prompts(10)
    slim = LocalEngine(model, tok, max_batch_size=4, seed=0)  # 4 rows: rows join and leave
    plain = LocalEngine(model, tok, max_batch_size=4, seed=0, slim_decode=False)
    a, b = _generate(slim, prompts), _generate(plain, prompts)
    assert slim.stats["slim_decode"] == 1.0 and plain.stats["slim_decode"] == 0.0
    for p, g, h in zip(prompts, a, b, strict=True):
        assert g.token_ids == h.token_ids  # seeded: the same draws
        ref = sequence_logprobs(model, p + g.token_ids, 0.9)[len(p):]
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4)


def test_slim_step_matches_the_forward_on_a_left_padded_cache_with_holes():
    # a Llama 3 (scaled RoPE) decoder: rows of different lengths, left padding, explicit positions
    model = _llama()
    rng = random.Random(1)
    lengths = [5, 17, 11]
    width = max(lengths)
    ids = torch.zeros((3, width), dtype=torch.long)
    mask = torch.zeros((3, width), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.tensor([rng.randrange(3, 400) for _ in range(n)])
        mask[i, width - n:] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    kv = BatchKV.empty(mask, lengths)
    with torch.no_grad():
        model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
            past_key_values=kv.cache,
        )
        kv.zero_padding()
        nxt = torch.tensor([[7], [8], [9]])
        ext = kv.extend_mask()
        trial = kv.clone()
        want = model(
            input_ids=nxt, attention_mask=ext, position_ids=torch.tensor([[n] for n in lengths]),
            use_cache=True, past_key_values=kv.cache,
        ).logits[:, -1]
        got = SlimDecoder.for_model(model)(nxt, torch.tensor(lengths), trial.mask, trial.cache)
    assert slim_decode.agrees(got, want) is not None
    # it wrote the same keys/values
    for a, b in zip(kv.cache.layers, trial.cache.layers, strict=True):
        torch.testing.assert_close(a.used()[0], b.used()[0], atol=1e-5, rtol=1e-5)


def _smollm2_shaped(layers=30):
    """A small decoder of SmolLM2-135M's kind (Llama, 3 query heads per key/value head, tied
    embeddings, RoPE theta 1e5, rms eps 1e-5, 30 layers), with Llama's biases on and nonzero."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=500, hidden_size=72, num_hidden_layers=layers, num_attention_heads=9,
        num_key_value_heads=3, head_dim=8, intermediate_size=192, max_position_embeddings=256,
        tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0, attention_bias=True,
        mlp_bias=True, pad_token_id=0, eos_token_id=1,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):  # transformers initializes biases to zero
                p.normal_(0, 0.1)
    return model


def _decode_step_both_ways(model, lengths, exact=True):
    """One decode step after a left-padded prefill: (slim logits, the model's forward logits)."""
    rng = random.Random(1)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.tensor([rng.randrange(3, 400) for _ in range(n)])
        mask[i, width - n:] = 1
    kv = BatchKV.empty(mask, lengths)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
              use_cache=True, past_key_values=kv.cache)
        kv.zero_padding()
        nxt = torch.tensor([[7 + i] for i in range(len(lengths))])
        ext = kv.extend_mask()
        trial = kv.clone()
        want = model(
            input_ids=nxt, attention_mask=ext, position_ids=torch.tensor([[n] for n in lengths]),
            use_cache=True, past_key_values=kv.cache,
        ).logits[:, -1]
        got = SlimDecoder.for_model(model)(
            nxt, torch.tensor(lengths), trial.mask, trial.cache, exact=exact
        )
    return got, want


@pytest.mark.parametrize("lengths", [[9], [5, 17], [5, 17, 11, 30, 2, 8]])
def test_slim_step_is_the_llama_forward_bit_for_bit(lengths):
    # the exact slim path (the engine's check) runs the kernels the model's forward runs on the
    # same shapes: the model's own projections (one row: a matrix-vector product rounds by the
    # matrix's height, and the served path uses them too), grouped
    # query heads packed as transformers' SDPA path packs them (SDPA's enable_gqa sums in another
    # order: SmolLM2-135M's 30 layers grew that past the engine's 1e-4 check, which then dropped
    # the slim path), Llama's MLP biases. So its logits are the forward's, not merely close
    got, want = _decode_step_both_ways(_smollm2_shaped(), lengths)
    assert torch.equal(got, want), float((got - want).abs().max())


@pytest.mark.parametrize("lengths", [[9], [5, 17, 11, 30, 2, 8]])
def test_the_served_step_through_packed_gemms_is_the_forward_within_rounding(lengths):
    # batches of 2+ rows go through oneDNN-packed GEMMs (another fp32 summation order); one
    # row through the model's own layers, so bit for bit
    got, want = _decode_step_both_ways(_smollm2_shaped(), lengths, exact=False)
    assert slim_decode.agrees(got, want) is not None
    if len(lengths) == 1:
        assert torch.equal(got, want)


def test_architectures_it_does_not_know_keep_the_models_forward(tok):
    gpt2 = GPT2LMHeadModel(
        GPT2Config(vocab_size=500, n_embd=32, n_layer=1, n_head=2, n_positions=128)
    ).eval()
    assert SlimDecoder.for_model(gpt2) is None
    engine = LocalEngine(gpt2, tok, seed=0)
    g = _generate(engine, _prompts(2))[0]
    assert engine.stats["slim_decode"] == 0.0 and len(g.token_ids) > 0


def test_a_slim_path_that_disagrees_is_dropped_at_the_first_step(tok, monkeypatch, caplog):
    model = create_policy(tok, "tiny", seed=0)
    real = SlimDecoder.__call__
    monkeypatch.setattr(
        SlimDecoder,
        "__call__",
        lambda self, *a, **kw: (lambda x: x + 0.01 * torch.randn_like(x))(real(self, *a, **kw)),
    )
    engine = LocalEngine(model, tok, seed=0)
    prompts = _prompts(3)
    with caplog.at_level(logging.WARNING, logger="taurl.engine"):
        outs = _generate(engine, prompts)
    assert engine.stats["slim_decode"] == 0.0 and "disagrees" in caplog.text
    for p, g in zip(prompts, outs, strict=True):  # the model's forward served every step
        ref = sequence_logprobs(model, p + g.token_ids, 0.9)[len(p):]
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4)


def test_after_a_weight_update_the_slim_path_serves_the_new_weights(tok):
    model = create_policy(tok, "tiny", seed=0)
    new = create_policy(tok, "tiny", seed=1)
    engine = LocalEngine(model, tok, seed=0)
    prompts = _prompts(3)
    _generate(engine, prompts)
    assert engine.stats["slim_decode"] == 1.0
    asyncio.run(engine.update_weights(new.state_dict(), version=1))
    for p, g in zip(prompts, _generate(engine, prompts), strict=True):
        ref = sequence_logprobs(new, p + g.token_ids, 0.9)[len(p):]
        assert g.policy_version == 1 and torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4)


def test_a_request_gives_the_same_numbers_on_the_checked_step_and_after(tok, monkeypatch):
    # the first decode step (checked against the model's forward) is served by the slim path
    # too, so a seeded request repeated later returns the same logprobs bit for bit. The slim
    # path is tilted by a tiny known amount (within the check's 1e-4) so the two paths differ
    model = create_policy(tok, "tiny", seed=0)
    real = SlimDecoder.__call__
    monkeypatch.setattr(
        SlimDecoder,
        "__call__",
        lambda self, *a, **kw: (lambda x: x + 1e-7 * torch.arange(x.shape[-1], dtype=x.dtype))(
            real(self, *a, **kw)
        ),
    )
    engine = LocalEngine(model, tok, seed=0)
    p = _prompts(1, seed=4)[0]
    first = _generate(engine, [p])[0]
    again = _generate(engine, [p])[0]
    assert engine.stats["slim_decode"] == 1.0
    assert first.token_ids == again.token_ids and first.logprobs == again.logprobs
