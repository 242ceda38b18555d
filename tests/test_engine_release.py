"""The engine frees its caches of the current weights while the learner trains
(`LocalEngine.release_caches`): the prefix cache and the slim decoder's fused copies go, and
serving after gives the same tokens and the same logprobs to fp32 rounding."""

from __future__ import annotations

import asyncio
import random

import pytest

from taurl.policy.engine import LocalEngine, SamplingParams
from taurl.policy.model import create_policy
from taurl.policy.tokenizer import build_tokenizer

TEXTS = [f"Town{i} lies in Country{i % 13}; {i * 7} people live there." for i in range(300)]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(TEXTS, vocab_size=500)


def _generate(engine, prompts):
    async def main():
        return await asyncio.gather(*[engine.generate(p, SamplingParams(max_tokens=12, seed=i))
                                      for i, p in enumerate(prompts)])
    return asyncio.run(main())


def test_released_caches_are_empty_and_serving_after_is_unchanged(tok):
    rng = random.Random(0)
    prompts = [[rng.randrange(20, 400) for _ in range(rng.randint(3, 30))] for _ in range(4)]
    # lock-step batching: the same batches on both passes (a rebuild takes time, and another
    # batch composition would round, and so sample, differently)
    engine = LocalEngine(create_policy(tok, "tiny", seed=0), tok, seed=0, deterministic=True)
    first = _generate(engine, prompts)
    assert engine.stats["slim_decode"] == 1.0 and engine._slim.projs
    engine.release_caches()
    assert engine._slim.projs == [] and engine._slim.head is None
    assert engine._prefixes._tokens == 0
    again = _generate(engine, prompts)  # the slim copies rebuilt on the first step
    assert engine._slim.projs
    for a, b in zip(first, again, strict=True):
        assert a.token_ids == b.token_ids  # the same samples; logprobs to fp32 rounding
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5
    engine.close()


def test_the_prefix_cache_is_emptied(tok):
    engine = LocalEngine(create_policy(tok, "tiny", seed=0), tok, seed=0)
    _generate(engine, [[20 + i for i in range(12)]] * 2)
    assert engine._prefixes._tokens > 0
    engine.release_caches()
    assert engine._prefixes._tokens == 0
    engine.close()


def test_nothing_is_freed_while_the_worker_is_decoding(tok, monkeypatch):
    """A row still decoding (an episode that timed out leaves its row running) reads the fused
    weights: release_caches waits for the worker to be idle, and keeps everything if it is not."""
    engine = LocalEngine(create_policy(tok, "tiny", seed=0), tok, seed=0)
    _generate(engine, [[20 + i for i in range(12)]] * 2)
    projs, head, cached = engine._slim.projs, engine._slim.head, engine._prefixes._tokens
    waited = []
    # the worker still busy when the wait ends (the idle worker would set the flag itself, so
    # clearing it here would race the worker's thread)
    monkeypatch.setattr(engine._idle, "wait", lambda timeout=None: waited.append(timeout))
    engine.release_caches(wait_s=0.05)
    assert waited == [0.05]
    assert engine._slim.projs is projs and engine._slim.head is head
    assert engine._prefixes._tokens == cached > 0
    monkeypatch.undo()
    engine.close()
