"""Episodes as chains of token streams in the learner (issue 30): each stream is its own row,
the episode's credit reaches every stream, and `segment_weighting` sets what an episode weighs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tests.train._tiny_lm import tiny_lm

from taurl.data.chains import join_streams, stream_turns, stream_views
from taurl.data.export import export_row
from taurl.data.ledger import Ledger
from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn, validate_trajectory
from taurl.errors import ConfigError, ContractError
from taurl.policy.logprobs import sequence_logprobs
from taurl.train.chains import split_streams
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.rows import make_rows

V = 64


@pytest.fixture(scope="module")
def model():
    return tiny_lm(V, max_positions=128)


def _stream(
    model, name: str, prompt: list[int], actions: list[list[int]], reward: float
) -> Trajectory:
    """One token stream: prompt, then actions separated by a 2-id observation;
    on-policy logprobs."""
    segs, turns, ids = [Segment("prompt", tuple(prompt))], [], list(prompt)
    for k, a in enumerate(actions):
        if k:
            segs.append(Segment("observation", (40 + k, 41)))
            ids += [40 + k, 41]
        lp = sequence_logprobs(model, ids + a)[len(ids):].tolist()
        segs.append(Segment("action", tuple(a), tuple(lp), 0))
        ids += a
        turns.append(Turn(k, "a", {"kind": "move"}, "", len(segs) - 1, None, "stop"))
    return Trajectory(
        episode_id=name, run_id="r", task_id="t", group_id="g", split="train", env_name="toy-v0",
        env_version="0", seed=0, segments=tuple(segs), turns=tuple(turns),
        messages=({"role": "user", "content": name}, {"role": "assistant", "content": "a"}),
        terminated=True, truncated=False, stop_reason=StopReason("goal"), reward=reward,
    )


def _chain(model, name: str, reward: float, n: int = 3) -> Trajectory:
    # every later stream's prompt is a different (compacted) text, so no stream extends another
    parts = [
        _stream(model, name, [5, 6 + k, 7], [[10 + k, 11], [12, 13 + k, 14]], reward)
        for k in range(n)
    ]
    return validate_trajectory(join_streams(parts, ["compaction"] * (n - 1)))


def test_a_chain_round_trips_through_the_ledger_and_the_export(model, tmp_path):
    chain = _chain(model, "c", 1.0)
    assert chain.num_streams == 3 and [s.reason for s in chain.stream_starts] == ["compaction"] * 2
    with Ledger(tmp_path / "l.db") as led:
        led.append(export_row(chain))
        assert led.get("c") == chain
    row = export_row(chain)
    assert row["num_streams"] == 3 and len(row["stream_starts"]) == 2
    views = stream_views(chain)
    assert [v.num_streams for v in views] == [1, 1, 1]
    assert sum(v.num_tokens for v in views) == chain.num_tokens
    assert [v.token_ids[:3] for v in views] == [[5, 6, 7], [5, 7, 7], [5, 8, 7]]
    assert stream_turns(chain) == [[0, 1], [2, 3], [4, 5]]


def test_make_rows_refuses_a_chain(model):
    with pytest.raises(ContractError, match="stream_views") as e:
        make_rows([_chain(model, "c", 1.0)], np.zeros((1, 6)), pad_id=0)
    assert e.value.rule == "stream_rows"


def test_the_episode_advantage_reaches_every_stream(model):
    learner = Learner(copy.deepcopy(model), LearnerConfig(lr=1e-2))
    chain, single = _chain(model, "c", 1.0), _stream(model, "s", [5, 6, 7], [[20, 21]], 0.0)
    kept, adv, _ = learner.advantages([chain, single])
    views, vadv = split_streams(kept, adv)
    assert len(views) == 4  # three streams of the chain, one of the single
    rows = make_rows(views, vadv, pad_id=0)
    # every chain stream: the chain's (positive) advantage on each action token, nowhere else
    for i in range(3):
        on = rows.advantages[i][rows.mask[i].bool()]
        assert (
            on.numel() == 5
            and torch.allclose(on, torch.full_like(on, float(adv[0, 0])))
            and adv[0, 0] > 0
        )
        assert not rows.advantages[i][~rows.mask[i].bool()].any()
    assert (rows.advantages[3][rows.mask[3].bool()] < 0).all()


def test_each_stream_is_recomputed_on_its_own_ids(model):
    """The behaviour logprobs were taken on each stream's own ids; the learner's recomputation
    matches them within 1e-4 only because it reads each stream as its own row."""
    m = copy.deepcopy(model)
    out = Learner(m, LearnerConfig(lr=1e-2)).update(
        [_chain(model, "c", 1.0), _chain(model, "d", 0.0, n=2)]
    )
    assert out["mismatch/abs_max"] < 1e-4 and out["learn/skipped"] == 0.0
    assert out["learn/action_tokens"] == 15 + 10


def test_episode_weighting_gives_each_episode_the_same_total_weight(model):
    long, short = _chain(model, "c", 1.0, n=4), _stream(model, "s", [5, 6, 7], [[20, 21]], 1.0)
    adv = np.ones((2, 8))
    for weighting, want in (("token", [20.0, 2.0]), ("episode", [11.0, 11.0])):
        views, vadv = split_streams([long, short], adv, weighting)
        rows = make_rows(views, vadv, pad_id=0)
        per_view = (rows.advantages * rows.mask).sum(1)
        assert [float(per_view[:4].sum()), float(per_view[4])] == pytest.approx(want), weighting


def test_episode_weighting_needs_token_mean():
    with pytest.raises(ConfigError, match="token-mean"):
        Learner(
            tiny_lm(V),
            LearnerConfig(segment_weighting="episode", aggregation="seq-mean-token-mean"),
        )
    with pytest.raises(ConfigError, match="segment_weighting"):
        Learner(tiny_lm(V), LearnerConfig(segment_weighting="stream"))


def test_sft_trains_a_chain_whose_last_stream_sampled_nothing(model):
    """A compaction right before the end leaves a stream of a prompt alone: SFT trains the
    other streams and skips it (its own micro-batch would have a loss with no gradient)."""
    from taurl.train.sft import sft_step

    parts = [
        _stream(model, "c", [5, 6, 7], [[10, 11], [12, 13]], 1.0),
        _stream(model, "c", [5, 9, 7], [], 1.0),
    ]
    chain = validate_trajectory(join_streams(parts, ["compaction"]))
    m = copy.deepcopy(model)
    out = sft_step(
        m, torch.optim.AdamW(m.parameters(), lr=1e-3), [chain], pad_id=0, micro_batch_tokens=4
    )
    assert out["sft/skipped"] == 0.0 and out["sft/action_tokens"] == 4.0
