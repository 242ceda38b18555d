"""The continuous-batching engine: exact logprobs, stops, sampling, seeds, weight swaps."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from taurl.errors import EngineError
from taurl.policy.engine import LocalEngine, SamplingParams, sample_tokens
from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import create_policy
from taurl.policy.tokenizer import build_tokenizer

TEXTS = [
    f"The city of Town{i} lies in Country{i % 17} and has {i * 37} people." for i in range(400)
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(TEXTS, vocab_size=600)


@pytest.fixture(scope="module")
def model(tok):
    return create_policy(tok, "tiny", seed=0)


def _prompts(n, seed=0, vocab=400):
    rng = random.Random(seed)
    return [[rng.randrange(20, vocab) for _ in range(rng.randint(3, 40))] for _ in range(n)]


def _check_logprobs(model, prompt, gen, temperature=1.0):
    lp = sequence_logprobs(model, prompt + gen.token_ids, temperature)[len(prompt):]
    assert torch.allclose(lp, torch.tensor(gen.logprobs), atol=1e-4), (
        (lp - torch.tensor(gen.logprobs)).abs().max()
    )


def test_staggered_requests_get_exact_logprobs(model, tok):
    """Requests join and leave the running batch at different times; each stays exact."""
    engine = LocalEngine(model, tok, max_batch_size=8)
    prompts = _prompts(12)

    async def one(i, p):
        await asyncio.sleep(0.01 * (i % 4))
        return await engine.generate(
            p, SamplingParams(max_tokens=5 + 3 * i, seed=i, temperature=0.8)
        )

    async def main():
        return await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)])

    outs = asyncio.run(main())
    for p, g in zip(prompts, outs, strict=True):
        _check_logprobs(model, p, g, temperature=0.8)
    assert engine.stats["prefills"] > 1  # they did not all arrive in one wave


def test_seeded_request_samples_the_same_ids_alone_or_in_a_batch(model, tok):
    engine = LocalEngine(model, tok)
    p = _prompts(1, seed=3)[0]
    sp = SamplingParams(max_tokens=16, seed=42)
    alone = asyncio.run(engine.generate(p, sp))

    async def crowd():
        others = [
            engine.generate(q, SamplingParams(max_tokens=20, seed=i))
            for i, q in enumerate(_prompts(7, 9))
        ]
        return (await asyncio.gather(engine.generate(p, sp), *others))[0]

    assert asyncio.run(crowd()).token_ids == alone.token_ids


def test_greedy_is_argmax_and_tiny_top_p_is_greedy(model, tok):
    engine = LocalEngine(model, tok)
    p = _prompts(1, seed=5)[0]
    g = asyncio.run(engine.generate(p, SamplingParams(temperature=0, max_tokens=8)))
    ids = list(p)
    for t in g.token_ids:
        with torch.no_grad():
            assert t == int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(t)
    nucleus = asyncio.run(
        engine.generate(p, SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=8, seed=1))
    )
    assert nucleus.token_ids == g.token_ids


def test_finish_reasons_length_stop_token_and_stop_string(model, tok):
    engine = LocalEngine(model, tok)
    p = _prompts(1, seed=6)[0]
    g = asyncio.run(engine.generate(p, SamplingParams(temperature=0, max_tokens=12)))
    assert g.finish_reason in ("length", "eos") and len(g.token_ids) <= 12
    # stop on the id greedy decoding produces at step 3: the completion ends there, inclusive
    stop_id = g.token_ids[3]
    first = g.token_ids.index(stop_id)
    s = asyncio.run(
        engine.generate(p, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop_id,)))
    )
    assert (
        s.finish_reason == "stop"
        and s.token_ids == g.token_ids[: first + 1]
        and s.stop_matched == stop_id
    )
    # a stop string that spans tokens: ends on the token that completes it, ids kept as sampled
    text = tok.decode(g.token_ids, skip_special_tokens=False)
    stop = text[3:7]
    s = asyncio.run(engine.generate(p, SamplingParams(temperature=0, max_tokens=12, stop=(stop,))))
    assert s.finish_reason == "stop" and s.stop_matched == stop
    assert stop in tok.decode(s.token_ids) and stop not in tok.decode(s.token_ids[:-1])
    assert s.token_ids == g.token_ids[:len(s.token_ids)]


def test_sampler_follows_the_distribution_and_the_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    lp = probs.log()
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_tokens(lp, [1.0], [gen]) for _ in range(4000)]).flatten()
    freq = torch.bincount(draws, minlength=4).float() / 4000
    assert torch.allclose(freq, probs[0], atol=0.03), freq
    # top_p = 0.8 keeps {0.5, 0.3}: the smallest prefix whose mass reaches 0.8
    draws = torch.stack([sample_tokens(lp, [0.8], [gen]) for _ in range(2000)]).flatten()
    assert set(draws.tolist()) == {0, 1}
    assert abs((draws == 0).float().mean() - 0.5 / 0.8) < 0.04


def test_update_weights_waits_for_in_flight_requests(model, tok):
    engine = LocalEngine(model, tok)
    new_state = {k: v.clone() * 1.01 for k, v in model.state_dict().items()}
    p = _prompts(1, seed=8)[0]

    async def main():
        long = asyncio.create_task(engine.generate(p, SamplingParams(max_tokens=40, seed=0)))
        await asyncio.sleep(0.02)
        await engine.update_weights(new_state, version=7)
        after = await engine.generate(p, SamplingParams(max_tokens=4, seed=0))
        return await long, after

    try:
        before, after = asyncio.run(main())
        assert before.policy_version == 0 and after.policy_version == 7 and engine.version == 7
        assert len(before.token_ids) == 40 or before.finish_reason == "eos"
    finally:
        engine.model.load_state_dict({k: v / 1.01 for k, v in new_state.items()})


def test_bad_requests_raise_clear_errors(model, tok):
    engine = LocalEngine(model, tok, max_context=64)
    with pytest.raises(EngineError, match="empty"):
        asyncio.run(engine.generate([], SamplingParams()))
    with pytest.raises(EngineError, match="context"):
        asyncio.run(engine.generate([5] * 64, SamplingParams()))
    with pytest.raises(EngineError, match="tokenizer"):
        asyncio.run(engine.generate([10**6], SamplingParams()))
    with pytest.raises(EngineError, match="top_p"):
        SamplingParams(top_p=0)
    g = asyncio.run(engine.generate([5] * 60, SamplingParams(max_tokens=50)))
    assert len(g.token_ids) <= 4 and (g.finish_reason in ("length", "eos"))


def test_requests_that_finish_at_their_first_token_never_strand_the_others(model, tok):
    """Regression: a row finishing on its prefill token used to evict a running row."""
    engine = LocalEngine(model, tok, max_batch_size=16)
    long_prompts, short_prompts = _prompts(4, seed=11), _prompts(4, seed=12)

    async def main():
        running = [asyncio.create_task(engine.generate(p, SamplingParams(max_tokens=60, seed=i)))
                   for i, p in enumerate(long_prompts)]
        await asyncio.sleep(0.15)  # the long ones are decoding now
        short = [
            engine.generate(p, SamplingParams(max_tokens=1, seed=i))
            for i, p in enumerate(short_prompts)
        ]
        return await asyncio.wait_for(asyncio.gather(*running, *short), timeout=60)

    outs = asyncio.run(main())
    for p, g in zip(long_prompts + short_prompts, outs, strict=True):
        _check_logprobs(model, p, g)
    assert [len(g.token_ids) for g in outs[4:]] == [1, 1, 1, 1]


def test_next_turn_reuses_the_finished_sequence_and_stays_exact(model, tok):
    """Turn 2's prompt extends turn 1's sequence: its prefix KV is reused, results unchanged."""
    cached, plain = LocalEngine(model, tok), LocalEngine(model, tok, prefix_cache_tokens=0)
    prompts = _prompts(6, seed=13)

    async def episode(engine, p, i):
        first = await engine.generate(p, SamplingParams(max_tokens=6, seed=i))
        second_prompt = p + first.token_ids + [7, 8, 9]  # + an observation
        return (
            first,
            second_prompt,
            await engine.generate(second_prompt, SamplingParams(max_tokens=6, seed=100 + i)),
        )

    async def run(engine):
        return await asyncio.gather(*[episode(engine, p, i) for i, p in enumerate(prompts)])

    with_cache, without = asyncio.run(run(cached)), asyncio.run(run(plain))
    assert cached.stats["prefix_tokens_reused"] > 0 and plain.stats["prefix_tokens_reused"] == 0
    for (f1, p2, s1), (f2, _, s2) in zip(with_cache, without, strict=True):
        assert f1.token_ids == f2.token_ids and s1.token_ids == s2.token_ids
        _check_logprobs(model, p2, s1)


def test_a_groups_identical_prompts_are_prefilled_once_and_stay_exact(model, tok):
    """G rollouts of one task share their first prompt: one prefill row serves all of them."""
    engine = LocalEngine(model, tok, max_batch_size=16)
    shared, other = _prompts(2, seed=5)
    prompts = [shared] * 6 + [other] * 2

    async def main():  # paused while they arrive, so they are admitted in one wave
        await engine.pause()
        calls = [
            asyncio.create_task(
                engine.generate(p, SamplingParams(max_tokens=6, seed=i, temperature=1.0))
            )
            for i, p in enumerate(prompts)
        ]
        await asyncio.sleep(0.05)
        await engine.resume()
        return await asyncio.gather(*calls)

    outs = asyncio.run(main())
    # one row per distinct prompt (two forwards at most: the two lengths may be chunked apart)
    assert engine.stats["prefills"] <= 2 and engine.stats["prefill_rows_shared"] == 6
    assert engine.stats["prefill_tokens"] == len(shared) + len(other)
    for p, g in zip(prompts, outs, strict=True):
        _check_logprobs(model, p, g)
    assert len({tuple(g.token_ids) for g in outs[:6]}) > 1  # each row still samples its own tokens
    alone = LocalEngine(model, tok)  # a seeded row samples what it samples alone
    solo = asyncio.run(
        alone.generate(shared, SamplingParams(max_tokens=6, seed=3, temperature=1.0))
    )
    assert solo.token_ids == outs[3].token_ids


def test_waiting_requests_are_served_lowest_priority_first_and_stay_exact(model, tok):
    """With the batch full, a request of lower priority value jumps the queue (the async
    schedule ranks by group age); equal priorities keep arrival order."""
    engine = LocalEngine(model, tok, max_batch_size=1)
    prompts = _prompts(6, seed=5)
    priorities = [0, 5, 3, 3, 1, 9]
    served: list[int] = []

    async def main():
        async def one(i):
            g = await engine.generate(
                prompts[i], SamplingParams(max_tokens=4, seed=i, priority=priorities[i])
            )
            served.append(i)
            return g
        await engine.pause("wait")  # every request waits in the queue before any is served
        tasks = [asyncio.create_task(one(i)) for i in range(6)]
        while (await engine.health()).in_flight < 6:
            await asyncio.sleep(0)
        await engine.resume()
        return await asyncio.gather(*tasks)

    outs = asyncio.run(main())
    assert served == [0, 4, 2, 3, 1, 5]
    for p, g in zip(prompts, outs, strict=True):
        _check_logprobs(model, p, g)


def test_prompts_of_very_different_lengths_are_prefilled_apart_and_stay_exact(model, tok):
    """One forward pads every row to the longest; rows of similar length share one, a much
    longer row gets its own (padding under PREFILL_PAD_WASTE of the real tokens)."""
    from taurl.policy.engine import PREFILL_PAD_WASTE

    def wave(lengths):
        engine = LocalEngine(model, tok, max_batch_size=16)
        rng = random.Random(sum(lengths))
        prompts = [[rng.randrange(20, 400) for _ in range(n)] for n in lengths]

        async def main():
            await engine.pause()
            calls = [asyncio.create_task(engine.generate(p, SamplingParams(max_tokens=5, seed=i)))
                     for i, p in enumerate(prompts)]
            await asyncio.sleep(0.05)
            await engine.resume()
            return await asyncio.gather(*calls)

        outs = asyncio.run(main())
        for p, g in zip(prompts, outs, strict=True):
            _check_logprobs(model, p, g)
        return engine.stats["prefills"]

    assert PREFILL_PAD_WASTE < 1
    assert wave([20, 20, 19, 18]) == 1
    assert wave([60, 4, 3, 3]) == 2  # 4 rows padded to 60 would be 240 positions for 70 tokens


def test_pause_after_a_paused_wait_still_waits_for_the_running_forward(model, tok):
    """A pause must not return while a forward pass runs. Before: the worker set `_idle` while
    paused with work queued and never cleared it once it resumed, so the next pause (a weight
    swap) returned at once and rebuilt the slim decoder's weights mid-step (CI: 'engine step
    failed: IndexError: list index out of range' in the async schedule's interrupt test)."""
    import threading
    import time

    engine = LocalEngine(model, tok, max_batch_size=4)
    in_forward, slow = threading.Event(), threading.Event()
    real = engine._decode

    def decode(batch, kv):  # a slow step we can see from outside the worker
        in_forward.set()
        if not slow.is_set():
            slow.set()
            time.sleep(0.5)
        try:
            return real(batch, kv)
        finally:
            in_forward.clear()

    engine._decode = decode

    async def main():
        await engine.pause("wait")
        job = asyncio.ensure_future(
            engine.generate(_prompts(1, seed=5)[0], SamplingParams(max_tokens=8, seed=0))
        )
        await asyncio.sleep(0.2)  # the worker sees the queued request while paused
        await engine.resume()
        while not in_forward.is_set():
            await asyncio.sleep(0.005)
        await engine.pause("abort")
        running_when_paused = in_forward.is_set()
        await engine.resume()
        await job
        return running_when_paused

    assert asyncio.run(main()) is False
