"""The rollout/learn overhead cuts are exact: each fast path equals its slow reference."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import namedtuple
from dataclasses import dataclass

import pytest
from tests.test_ledger import make_traj

from taurl.data.admission import _json_problem
from taurl.data.ledger import Ledger
from taurl.data.trajectory import Trajectory, plain_asdict

Point = namedtuple("Point", "x y")


class Tags(list):
    pass


@dataclass(frozen=True)
class Inner:
    ids: tuple
    extra: object


def _same(a, b) -> bool:
    """Equal values and equal types all the way down (asdict keeps tuples as tuples)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("obj", [
    make_traj(),
    make_traj(correct=False, versions=(0, 0)),
    Inner((1, 2.5, True, None, "x"), {"k": [1, (2, 3)], (1, 2): Point(1, [2])}),
    Inner((), Tags([1, 2])),
    Inner((float("nan"), float("inf")), {"deep": [{"a": (Inner((1,), None),)}]}),
])
def test_plain_asdict_equals_dataclasses_asdict(obj):
    assert _same(plain_asdict(obj), dataclasses.asdict(obj))


def test_to_dict_round_trip_unchanged():
    t = make_traj()
    d = t.to_dict()
    assert _same(d, {**dataclasses.asdict(t), "stop_reason": str.__str__(t.stop_reason)})
    assert Trajectory.from_dict(json.loads(json.dumps(d))) == t


@pytest.mark.parametrize("x", [
    [1, 2, 3], (True, 0, 7), [], [0.5, -1e30, 3], [1.0, float("nan")], [float("inf"), 2],
    [1, None, 2.0], [1, "a"], [1, 2.0, "\ud800"], [Point(1, 2)], [[1, 2], [3.0, float("-inf")]],
    [Tags([1])], [1, {"a": float("nan")}], [{1: 2}],
])
@pytest.mark.parametrize("finite", [False, True])
def test_json_problem_fast_path_matches_element_walk(x, finite):
    # the walk without the fast path (ledger's rules, element by element)
    def slow(v, where="record"):
        if isinstance(v, (list, tuple)):
            return next((p for i, e in enumerate(v) if (p := slow(e, f"{where}[{i}]"))), None)
        return _json_problem(v, finite, where)
    assert _json_problem(x, finite) == slow(x)


def test_ledger_stores_the_same_json():
    """The stored record is the canonical JSON of the trajectory (compared to asdict's)."""
    t = make_traj()
    with Ledger(":memory:") as led:
        led.append(t)
        assert led.get(t.episode_id) == t
    ref = json.loads(
        json.dumps({**dataclasses.asdict(t), "stop_reason": str.__str__(t.stop_reason)})
    )
    assert json.loads(json.dumps(t.to_dict())) == ref


# --- the learner's length buckets (an optimal partition instead of a greedy fill) -----------


def _greedy_buckets(lens: list[int], max_tokens: int) -> list[list[int]]:
    """The previous greedy fill, the reference the partition must never lose to."""
    order = sorted(range(len(lens)), key=lambda i: lens[i])
    out, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * lens[i] > max_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    return out + [cur] if cur else out


def _cost(buckets, lens) -> int:
    from taurl.train.rows import MICRO_BATCH_COST_TOKENS

    return sum(len(b) * max(lens[i] for i in b) + MICRO_BATCH_COST_TOKENS for b in buckets)


class _Len:
    def __init__(self, n: int):
        self.num_tokens = n


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_tokens", [100, 700, 6144])
def test_micro_batches_partition_is_valid_and_never_worse_than_greedy(seed, max_tokens):
    import random

    from taurl.train.rows import micro_batches

    rng = random.Random(seed)
    # the demo's shape: most rows ~40-60 tokens, a heavy tail to ~250 (and one over the cap)
    lens = [
        rng.choice([rng.randint(38, 60), rng.randint(60, 250)]) for _ in range(rng.randint(1, 80))
    ]
    lens.append(max_tokens + 5)
    buckets = micro_batches([_Len(n) for n in lens], max_tokens)
    assert sorted(i for b in buckets for i in b) == list(range(len(lens)))  # every row once
    for b in buckets:
        assert len(b) == 1 or len(b) * max(lens[i] for i in b) <= max_tokens
    assert _cost(buckets, lens) <= _cost(_greedy_buckets(lens, max_tokens), lens)


def test_micro_batches_on_a_tail_cut_padding():
    """The demo's first GRPO batch (64 rows): greedy pads half of it, the partition ~2%."""
    from taurl.train.rows import micro_batches

    counts = {
        42: 36,
        44: 6,
        47: 1,
        48: 5,
        122: 3,
        124: 5,
        126: 2,
        132: 1,
        133: 1,
        135: 1,
        141: 1,
        209: 1,
        222: 1,
    }
    lens = [n for n, k in counts.items() for _ in range(k)]
    real = sum(lens)

    def padding(buckets):
        return 1 - real / sum(len(b) * max(lens[i] for i in b) for b in buckets)

    assert padding(_greedy_buckets(lens, 6144)) > 0.4
    assert padding(micro_batches([_Len(n) for n in lens], 6144)) < 0.05


def test_bucketed_logprobs_equal_one_row_at_a_time():
    """Recomputed logprobs of rows padded into buckets equal each row alone, within 1e-5."""
    import numpy as np
    import torch
    from tests.train.test_learner_invalid import _model, _traj

    from taurl.train.rows import action_logprobs, make_rows, micro_batches

    model = _model()
    rng = np.random.default_rng(0)
    trajs = [
        _traj(
            model, f"e{i}", [5, 6, 7], [int(x) for x in rng.integers(2, 60, size=n)], float(i % 2)
        )
        for i, n in enumerate([3, 4, 4, 9, 17, 30, 31, 5, 60, 2])
    ]
    alone = {}
    with torch.no_grad():
        for i, t in enumerate(trajs):
            r = make_rows([t], np.zeros((1, 1)), 0)
            alone[i] = action_logprobs(model, r)[0][0, :t.num_tokens]
        buckets = micro_batches(trajs, 120)
        assert len(buckets) > 1
        for b in buckets:
            r = make_rows([trajs[i] for i in b], np.zeros((len(b), 1)), 0)
            lp = action_logprobs(model, r)[0]
            for k, i in enumerate(b):
                torch.testing.assert_close(lp[k, :trajs[i].num_tokens], alone[i], atol=1e-5, rtol=0)
                # and both equal the behaviour logprobs the rows were built with
                beh = torch.tensor(trajs[i].behaviour_logprobs)
                m = torch.tensor(trajs[i].action_mask, dtype=torch.bool)
                torch.testing.assert_close(
                    lp[k, : trajs[i].num_tokens][m], beh[m], atol=1e-5, rtol=0
                )


# --- the engine's decode loop (inference mode instead of no_grad) -------------------------


def test_engine_greedy_ids_and_logprobs_equal_a_slow_reference_loop():
    """Greedy completions of a continuously batched engine equal a plain loop that re-runs
    the whole sequence through the model for every token (no KV cache, no batching):
    the same ids, and logprobs within 1e-5."""
    import asyncio
    import random

    import torch

    from taurl.policy.engine import LocalEngine, SamplingParams
    from taurl.policy.model import create_policy
    from taurl.policy.tokenizer import build_tokenizer

    tok = build_tokenizer(
        [f"Town{i} lies in Country{i % 7} with {i * 37} people." for i in range(200)],
        vocab_size=400,
    )
    model = create_policy(tok, "tiny", seed=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(20, 300) for _ in range(rng.randint(3, 30))] for _ in range(6)]
    # fewer slots than requests: rows join and leave
    engine = LocalEngine(model, tok, max_batch_size=4)

    async def main():
        return await asyncio.gather(
            *[
                engine.generate(p, SamplingParams(temperature=0, max_tokens=6 + 2 * i))
                for i, p in enumerate(prompts)
            ]
        )

    outs = asyncio.run(main())
    with torch.no_grad():
        for i, (p, g) in enumerate(zip(prompts, outs, strict=True)):
            ids, lps = list(p), []
            for _ in range(len(g.token_ids)):
                logp = torch.log_softmax(
                    model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1
                )
                ids.append(int(logp.argmax()))
                lps.append(float(logp[ids[-1]]))
                if g.finish_reason != "length" and ids[-1] in engine.eos_ids:
                    break
            assert g.token_ids == ids[len(p):], i
            torch.testing.assert_close(
                torch.tensor(g.logprobs), torch.tensor(lps), atol=1e-5, rtol=0
            )
