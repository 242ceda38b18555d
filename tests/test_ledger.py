"""The ledger (taurl.data.ledger) and its export (taurl.data.export), on real SQLite files."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import math
import pathlib
import sqlite3
import threading
from itertools import count
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taurl.data.ledger as ledger_mod
from taurl.data import trajectory as trajectory_mod
from taurl.data.admission import RULES
from taurl.data.export import (
    EXPORT_FIELDS,
    export_fields_markdown,
    export_jsonl,
    export_parquet,
    export_row,
    parquet_schema,
    read_jsonl,
)
from taurl.data.ledger import AppendReport, Ledger
from taurl.data.trajectory import Segment, StopReason, ToolReceipt, Trajectory, Turn
from taurl.errors import ConfigError, ContractError, Error, UnknownEpisodeError

# ---------------------------------------------------------------------------------------
# A real-looking Search-R1 episode (Qwen2.5 chat-template ids), built by hand.

IM_START, IM_END, NL = 151644, 151645, 198
PROMPT = (IM_START, 8948, NL, 2610, 525, 264, 10950, 17847, 13, IM_END, NL,  # system
          # user: capital of France?
          IM_START, 872, NL, 3838, 374, 279, 6722, 315, 9625, 30, IM_END, NL,
          IM_START, 77091, NL)  # assistant header
SEARCH = (27, 1836, 29, 65063, 315, 9625, 522, 1836, 29)  # <search>capital of France</search>
SEARCH_LP = (-0.31, -0.02, -0.001, -1.25, -0.07, -0.004, -0.11, -0.0003, -0.0)
# <information>…</information>
INFO = (27, 25069, 29, 59604, 374, 279, 6722, 315, 9625, 13, 522, 25069, 29)
ANSWER = (27, 9217, 29, 59604, 522, 9217, 29, IM_END)  # <answer>Paris</answer><|im_end|>
ANSWER_LP = (-0.05, -0.001, -0.0002, -0.43, -0.02, -0.0001, -0.0, -0.009)


def make_traj(episode_id: str = "ep-0", *, run_id: str = "run-a", task_id: str = "nq-17",
              group_id: str = "nq-17/g0", split: str = "train", env_name: str = "search-v0",
              versions: tuple[int, int] = (3, 4), correct: bool = True,
              stop: StopReason = StopReason.ANSWERED) -> Trajectory:
    """prompt | action (search, v0) | observation | action (answer, v1) | template."""
    segments = (
        Segment("prompt", PROMPT),
        Segment("action", SEARCH, SEARCH_LP, versions[0]),
        Segment("observation", INFO),
        Segment("action", ANSWER, ANSWER_LP, versions[1]),
        Segment("template", (NL,)),
    )
    receipt = ToolReceipt("search", {"query": "capital of France"}, "allowed", "ok",
                          latency_s=0.004, output_chars=41)
    turns = (
        Turn(
            0, "<search>capital of France</search>",
            {"kind": "search", "query": "capital of France"},
            "<information>Paris is the capital of France.</information>", 1, 2, "stop",
            receipt=receipt, generate_s=0.12, env_s=0.004,
        ),
        Turn(
            1, "<answer>Paris</answer>", {"kind": "answer", "answer": "Paris"}, "", 3, None, "eos",
            generate_s=0.08,
        ),
    )
    messages = ({"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "<search>capital of France</search><information>"
                 "Paris is the capital of France.</information><answer>Paris</answer>"})
    outcome = 1.0 if correct else 0.0
    terminated = stop.is_termination
    return Trajectory(
        episode_id=episode_id, run_id=run_id, task_id=task_id, group_id=group_id, split=split,
        env_name=env_name, env_version="1.0", seed=1234, segments=segments, turns=turns,
        messages=messages, terminated=terminated, truncated=not terminated, stop_reason=stop,
        reward=outcome - 0.1, reward_components={"outcome": outcome, "format": -0.1},
        verifier_version="exact_match-v1", timings={"generate_s": 0.2, "env_s": 0.004},
        metadata={"question": "What is the capital of France?", "answers": ["Paris"]},
    )


def valid_dict(episode_id: str = "ep-0", **kw: Any) -> dict[str, Any]:
    return json.loads(json.dumps(make_traj(episode_id, **kw).to_dict()))


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as led:
        yield led


# ---------------------------------------------------------------------------------------
# Storing and reading back


def test_append_get_round_trip(ledger):
    t = make_traj("ep-1")
    assert ledger.append(t) == "ep-1"
    assert ledger.get("ep-1") == t
    assert ledger.append(valid_dict("ep-2")) == "ep-2"
    assert ledger.get("ep-2") == make_traj("ep-2")
    assert "ep-1" in ledger and "nope" not in ledger
    assert len(ledger) == 2 and ledger.rejections() == []


def test_get_unknown_episode(ledger):
    with pytest.raises(UnknownEpisodeError, match="no trajectory with episode_id 'nope'"):
        ledger.get("nope")
    with pytest.raises(KeyError):
        ledger.get("nope")


def test_closed_ledger_says_so(tmp_path):
    led = Ledger(tmp_path / "l.db")
    led.close()
    led.close()  # idempotent
    with pytest.raises(Error, match="closed"):
        led.append(make_traj())


def test_not_a_ledger_file(tmp_path):
    p = tmp_path / "junk.db"
    p.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(Error, match="not a usable taurl ledger"):
        Ledger(p)


def test_wal_mode(ledger):
    assert ledger._db().execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_reopen_continues(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger(path) as led:
        led.append_many([make_traj(f"ep-{i}") for i in range(3)])
        with pytest.raises(ContractError):
            led.append(make_traj("ep-0"))
    with Ledger(path) as led:
        assert led.episode_ids() == ["ep-0", "ep-1", "ep-2"]
        assert led.get("ep-1") == make_traj("ep-1")
        assert [r.rule for r in led.rejections()] == ["duplicate_episode"]
        led.append(make_traj("ep-3"))
        with pytest.raises(ContractError) as e:
            led.append(make_traj("ep-2"))  # duplicates are seen across sessions
        assert e.value.rule == "duplicate_episode"
        seqs = [r[0] for r in led._db().execute("SELECT seq FROM trajectories ORDER BY seq")]
        assert seqs == [1, 2, 3, 4]


# ---------------------------------------------------------------------------------------
# Append-only, enforced by SQLite itself (a second, raw connection)


@pytest.mark.parametrize("sql", [
    "UPDATE trajectories SET reward = 5.0",
    "UPDATE trajectories SET record = '{}' WHERE episode_id = 'ep-0'",
    "DELETE FROM trajectories",
    "DELETE FROM trajectories WHERE episode_id = 'ep-0'",
    "INSERT OR REPLACE INTO trajectories SELECT * FROM trajectories",
    "UPDATE rejections SET rule = 'fine'",
    "DELETE FROM rejections",
])
def test_append_only_in_sql(tmp_path, sql):
    path = tmp_path / "ledger.db"
    with Ledger(path) as led:
        led.append(make_traj("ep-0"))
        with pytest.raises(ContractError):
            led.append({"garbage": True})
    raw = sqlite3.connect(path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        raw.execute(sql)
    raw.close()
    with Ledger(path) as led:
        assert led.get("ep-0") == make_traj("ep-0") and len(led.rejections()) == 1


# ---------------------------------------------------------------------------------------
# One test per rejection rule: (rule, a broken record)


def _seg(d: dict, i: int, **kv: Any) -> dict:
    d["segments"][i].update(kv)
    return d


def _row(eid: str = "ep-x") -> dict:
    return export_row(make_traj(eid))


def _deep(n: int) -> dict:
    d: dict = {}
    for _ in range(n):
        d = {"k": d}
    return d


def _with(d: dict, **kv: Any) -> dict:
    d.update(kv)
    return d


CASES: dict[str, list[Any]] = {
    "schema": [
        ["not", "a", "dict"],
        42,
        {k: v for k, v in valid_dict().items() if k != "segments"},
        _with(valid_dict(), seed="1234"),
        _with(valid_dict(), reward=True),
        _with(valid_dict(), rewrd=1.0),  # unknown field: a typo is not silently dropped
        _with(valid_dict(), reward_components={"outcome": "0.9"}),  # no coercion
        _with(valid_dict(), stop_reason=3),
        _with(valid_dict(), provenance=["corpus", "3f2a"]),  # a JSON object, or absent
        dataclasses.replace(make_traj(), provenance=["map", 3]),
        _with(valid_dict(), source=None),
        _seg(valid_dict(), 1, policy_version="3"),
        _seg(valid_dict(), 1, mask=1),
    ],
    "not_json": [
        _with(valid_dict(), timings={"generate_s": math.nan}),
        _with(valid_dict(), metadata={"bad": "\ud800"}),
        dataclasses.replace(make_traj(), metadata={1: "int key"}),
        dataclasses.replace(make_traj(), metadata={"s": {1, 2}}),
        _with(valid_dict(), metadata=_deep(600)),
        _with(valid_dict(), metadata=_deep(5000)),
        dataclasses.replace(make_traj(), metadata=_deep(5000)),
    ],
    "missing_identity": [_with(valid_dict(), task_id="")],
    "seed_range": [_with(valid_dict(), seed=2**63)],
    "empty_trajectory": [_with(valid_dict(), segments=[], turns=[])],
    "prompt_first": [_with(valid_dict(), segments=valid_dict()["segments"][1:], turns=[])],
    "segment_kind": [_seg(valid_dict(), 4, kind="tool")],
    "empty_segment": [_seg(valid_dict(), 2, token_ids=[])],
    "token_range": [
        _seg(valid_dict(), 0, token_ids=[-1, 5]),
        _seg(valid_dict(), 0, token_ids=[2**31]),
        _seg(valid_dict(), 0, token_ids=[1.0, 2]),
    ],
    "logprobs_length": [
        _seg(valid_dict(), 1, logprobs=list(SEARCH_LP[:-1])),
        _seg(valid_dict(), 3, logprobs=None),
    ],
    "logprob_range": [
        _seg(valid_dict(), 1, logprobs=[0.5, *SEARCH_LP[1:]]),
        _seg(valid_dict(), 1, logprobs=[-math.inf, *SEARCH_LP[1:]]),
    ],
    "action_without_version": [_seg(valid_dict(), 3, policy_version=None)],
    # a demonstration that carries a made-up logprob or version is refused
    "behaviour_without_policy": [
        _seg(_with(valid_dict(), source="expert"), 1, policy_version=None),
        _seg(_with(valid_dict(), source="expert"), 1, logprobs=None),
    ],
    "source_name": [_with(valid_dict(), source="Expert demo"), _with(valid_dict(), source="")],
    "version_range": [_seg(valid_dict(), 3, policy_version=-1)],
    "non_action_logprobs": [
        _seg(valid_dict(), 2, logprobs=[0.0] * len(INFO)),
        _seg(valid_dict(), 0, policy_version=3),
    ],
    # a later stream starts at a prompt segment, after the last one, with a snake_case reason;
    # a prompt segment in the middle of a stream would hide a stream from the learner
    "stream_start": [
        _with(valid_dict(), stream_starts=[{"segment": 2, "message": 2, "reason": "compaction"}]),
        _with(_seg(valid_dict(), 2, kind="prompt"), turns=valid_dict()["turns"][1:]),
        _with(
            _seg(valid_dict(), 2, kind="prompt"),
            turns=valid_dict()["turns"][1:],
            stream_starts=[{"segment": 2, "message": 2, "reason": "Compacted!"}],
        ),
        _with(
            _seg(valid_dict(), 2, kind="prompt"),
            turns=valid_dict()["turns"][1:],
            stream_starts=[{"segment": 2, "message": 9, "reason": "compaction"}],
        ),
    ],
    "turn_segment": [
        json.loads(
            json.dumps(
                dataclasses.replace(
                    make_traj(),
                    turns=(dataclasses.replace(make_traj().turns[0], action_segment=2),),
                ).to_dict()
            )
        )
    ],
    "missing_stop_reason": [_with(valid_dict(), stop_reason=None)],
    "stop_reason_name": [
        _with(valid_dict(), stop_reason="Finished!"),
        _with(valid_dict(), stop_reason=""),
        dataclasses.replace(make_traj(), stop_reason="reached goal"),
    ],
    "termination_flags": [
        _with(valid_dict(), truncated=True),
        # "answered" truncated
        _with(valid_dict(), terminated=False, truncated=True),
        # a loop truncation, terminated
        _with(valid_dict(), stop_reason="max_turns"),
        _with(valid_dict(), stop_reason="goal", terminated=True, truncated=True),
    ],
    "reward_finite": [_with(valid_dict(), reward=math.inf, reward_components={})],
    "reward_components_sum": [_with(valid_dict(), reward=1.0)],
    "missing_verifier_version": [_with(valid_dict(), verifier_version="")],
    "duplicate_episode": ["DUP"],  # see the test
    "flat_length_mismatch": [
        _with(_row(), token_ids=_row()["token_ids"][:-1]),
        _with(_row(), logprobs=_row()["logprobs"] + [0.0]),
    ],
    "mask_mismatch": [
        _with(_row(), action_mask=[1] * len(_row()["action_mask"])),
        _with(_row(), action_mask=[bool(m) for m in _row()["action_mask"]]),
    ],
    "flat_values_mismatch": [
        _with(_row(), token_ids=[0] + _row()["token_ids"][1:]),
        _with(_row(), logprobs=[-0.5 if m else 0.0 for m in _row()["action_mask"]]),
        _with(_row(), token_versions=[7] * len(_row()["token_ids"])),
    ],
    "derived_mismatch": [
        _with(_row(), num_tokens=3), _with(_row(), valid=False), _with(_row(), policy_versions=[4]),
        _with(_row(), num_turns=2.0),
    ],
}


def test_every_rule_has_a_case_and_is_documented():
    assert set(CASES) == set(RULES)
    used = set()
    for mod in (trajectory_mod, ledger_mod, __import__("taurl.data.export", fromlist=["_"])):
        src = inspect.getsource(mod)
        for marker in ('bad("', 'ContractError("'):
            used |= {chunk.split('"')[0] for chunk in src.split(marker)[1:]}
    # rules raised when a stored record is used, not when it is appended: documented in formats
    use_rules = {"behaviour_top_p"}
    formats = (pathlib.Path(__file__).parents[1] / "docs" / "formats.md").read_text()
    assert all(f"`{rule}`" in formats for rule in use_rules)
    assert used - set(RULES) - use_rules == set(), (
        "a rule without an entry in taurl.data.admission.RULES"
    )


@pytest.mark.parametrize(
    ("rule", "i"), [(r, i) for r, cases in CASES.items() for i in range(len(cases))]
)
def test_rejection_rule(ledger, rule, i):
    item = CASES[rule][i]  # shared by the runs: append must not (and does not) change its input
    if rule == "duplicate_episode":
        ledger.append(make_traj("ep-x"))
        item = valid_dict("ep-x") if i == 0 else item
    with pytest.raises(ContractError) as e:
        ledger.append(item)
    assert e.value.rule == rule, str(e.value)
    # the refusal is recorded and nothing was stored
    rej = ledger.rejections()
    assert [r.rule for r in rej] == [rule]
    assert ledger.count() == (1 if rule == "duplicate_episode" else 0)
    assert ledger.stats()["rejected_by_rule"] == {rule: 1}


def test_duplicate_inside_one_batch(ledger):
    report = ledger.append_many([make_traj("a"), make_traj("b"), make_traj("a")])
    assert report.accepted == ("a", "b")
    assert [(r.index, r.episode_id, r.rule) for r in report.rejected] == [
        (2, "a", "duplicate_episode")
    ]


def test_validation_rejects_without_repair(ledger):
    # a flat array that agrees is accepted, and the stored record is the canonical one
    ledger.append(_row("fine"))
    assert ledger.get("fine") == make_traj("fine")


def test_reports_all_broken_rules(ledger):
    d = _with(valid_dict(), task_id="", truncated=True)
    with pytest.raises(ContractError, match=r"\[missing_identity\].*also: \[termination_flags\]"):
        ledger.append(d)


def test_append_many_keeps_the_good(ledger):
    items = [
        make_traj("g0"), {"junk": 1}, valid_dict("g1"), _with(valid_dict("g2"), truncated=True),
        None, make_traj("g3"),
    ]
    report = ledger.append_many(items)
    assert isinstance(report, AppendReport) and not report.ok
    assert report.accepted == ("g0", "g1", "g3")
    assert [(r.index, r.rule) for r in report.rejected] == [(1, "schema"), (3, "termination_flags"),
                                                            (4, "schema")]
    assert report.rejected[1].episode_id == "g2"
    assert report.by_rule == {"schema": 2, "termination_flags": 1}
    assert ledger.episode_ids() == ["g0", "g1", "g3"]
    assert [(r.episode_id, r.rule) for r in ledger.rejections()] == [
        (None, "schema"), ("g2", "termination_flags"), (None, "schema")]


# ---------------------------------------------------------------------------------------
# Threads


def test_four_threads_append_fifty_each(ledger):
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(50):
                ledger.append(make_traj(f"t{k}-{i}", run_id=f"run-{k}"))
        except BaseException as e:  # surfaced below: a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert ledger.count() == 200
    seqs = [r[0] for r in ledger._db().execute("SELECT seq FROM trajectories ORDER BY seq")]
    assert seqs == list(range(1, 201))
    for k in range(4):  # each thread's appends keep their order
        assert ledger.episode_ids(run_id=f"run-{k}") == [f"t{k}-{i}" for i in range(50)]


def test_two_ledgers_on_one_file(tmp_path):
    path = tmp_path / "shared.db"
    a, b = Ledger(path), Ledger(path)
    ths = [threading.Thread(target=lambda led=led, k=k: led.append_many(
        [make_traj(f"{k}-{i}") for i in range(25)])) for k, led in (("a", a), ("b", b))]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert a.count() == b.count() == 50
    a.close()
    b.close()


# ---------------------------------------------------------------------------------------
# Queries


@pytest.fixture
def filled(ledger):
    ledger.append_many(
        [
            make_traj(
                "e0", run_id="r1", split="train", task_id="t0", group_id="g0", versions=(1, 2)
            ),
            make_traj(
                "e1", run_id="r1", split="train", task_id="t0", group_id="g0", versions=(2, 2),
                correct=False,
            ),
            make_traj(
                "e2", run_id="r1", split="holdout", task_id="t1", group_id="g1", versions=(3, 3)
            ),
            make_traj(
                "e3", run_id="r2", split="train", task_id="t2", group_id="g2", versions=(3, 5),
                stop=StopReason.ERROR,
            ),
            make_traj(
                "e4", run_id="r2", split="train", task_id="t2", group_id="g2", versions=(5, 5),
                env_name="code-v0", stop=StopReason.MAX_TURNS,
            ),
        ]
    )
    return ledger


@pytest.mark.parametrize(("filters", "ids"), [
    ({}, ["e0", "e1", "e2", "e3", "e4"]),
    ({"run_id": "r1"}, ["e0", "e1", "e2"]),
    ({"split": "holdout"}, ["e2"]),
    ({"task_id": "t2"}, ["e3", "e4"]),
    ({"group_id": "g0"}, ["e0", "e1"]),
    ({"min_version": 3}, ["e2", "e3", "e4"]),  # every action at version >= 3
    ({"min_version": 2}, ["e1", "e2", "e3", "e4"]),
    ({"max_version": 2}, ["e0", "e1"]),
    ({"min_version": 3, "max_version": 3}, ["e2"]),
    ({"env_name": "code-v0"}, ["e4"]),
    ({"valid": False}, ["e3"]),
    ({"valid": True, "run_id": "r2"}, ["e4"]),
    ({"limit": 2}, ["e0", "e1"]),
    ({"limit": 0}, []),
    ({"run_id": "nope"}, []),
])
def test_query_filters(filled, filters, ids):
    assert [t.episode_id for t in filled.query(**filters)] == ids
    assert filled.episode_ids(**filters) == ids
    assert [t.episode_id for t in filled.iter_query(**filters)] == ids
    no_limit = {k: v for k, v in filters.items() if k != "limit"}
    if "limit" not in filters:
        assert filled.count(**no_limit) == len(ids)


def test_iter_query_pages(filled, monkeypatch):
    monkeypatch.setattr(ledger_mod, "_PAGE", 2)  # force several pages over 5 rows
    assert [t.episode_id for t in filled.iter_query()] == ["e0", "e1", "e2", "e3", "e4"]
    assert [t.episode_id for t in filled.iter_query(limit=3)] == ["e0", "e1", "e2"]
    assert [t.episode_id for t in filled.iter_query(limit=4, run_id="r1")] == ["e0", "e1", "e2"]
    assert filled.query(split="train")[2] == make_traj(
        "e3", run_id="r2", split="train", task_id="t2", group_id="g2", versions=(3, 5),
        stop=StopReason.ERROR,
    )


def test_bad_limit(filled):
    with pytest.raises(ConfigError, match="limit"):
        filled.query(limit=-1)


def test_stats(filled):
    s = filled.stats()
    assert s["episodes"] == 5 and s["valid"] == 4
    assert s["terminated"] == 3 and s["truncated"] == 2
    # rewards: 0.9, -0.1, 0.9, 0.9, 0.9 (outcome - 0.1 format penalty)
    assert s["mean_reward"] == pytest.approx((0.9 * 4 - 0.1) / 5)
    assert s["stop_reasons"] == {"answered": 3, "error": 1, "max_turns": 1}
    n = make_traj().num_tokens
    assert s["num_tokens"] == 5 * n and s["num_action_tokens"] == 5 * (len(SEARCH) + len(ANSWER))
    assert s["num_turns"] == 10 and s["rejected"] == 0
    filled.append_many([_with(valid_dict("bad", run_id="r2"), task_id=""), {"x": 1}])
    r2 = filled.stats(run_id="r2")
    assert (
        r2["episodes"] == 2
        and r2["rejected"] == 1
        and r2["rejected_by_rule"] == {"missing_identity": 1}
    )
    assert filled.stats()["rejected"] == 2
    empty = filled.stats(run_id="none")
    assert empty["episodes"] == 0 and empty["mean_reward"] is None and empty["stop_reasons"] == {}


# ---------------------------------------------------------------------------------------
# Export


def test_export_fields_cover_rows():
    row = _row()
    assert set(row) == set(EXPORT_FIELDS) - {"record"}
    assert set(parquet_schema().names) == set(EXPORT_FIELDS) - {
        "segments", "turns", "messages", "stream_starts", "timings", "metadata",
    }
    md = export_fields_markdown()
    assert all(f"`{k}`" in md for k in EXPORT_FIELDS)
    assert "| `token_ids` | list<int32> |" in md


def test_export_row_arrays():
    t, row = make_traj(), _row()
    n_p, n_s, n_i, n_a = len(PROMPT), len(SEARCH), len(INFO), len(ANSWER)
    assert row["token_ids"] == [*PROMPT, *SEARCH, *INFO, *ANSWER, NL]
    assert row["action_mask"] == [0] * n_p + [1] * n_s + [0] * n_i + [1] * n_a + [0]
    assert row["logprobs"] == [0.0] * n_p + list(SEARCH_LP) + [0.0] * n_i + list(ANSWER_LP) + [0.0]
    assert row["token_versions"] == [-1] * n_p + [3] * n_s + [-1] * n_i + [4] * n_a + [-1]
    assert row["policy_versions"] == [3, 4]
    assert (row["num_tokens"], row["num_action_tokens"], row["num_turns"]) == (
        t.num_tokens,
        n_s + n_a,
        2,
    )
    assert (row["num_tool_calls"], row["num_invalid_actions"], row["num_errors"]) == (1, 0, 0)
    assert row["valid"] is True and row["stop_reason"] == "answered"


def test_export_jsonl_round_trip(filled, tmp_path):
    originals = filled.query()
    path = tmp_path / "out.jsonl"
    assert export_jsonl(filled, path) == 5
    rows = read_jsonl(path)
    assert [r["episode_id"] for r in rows] == ["e0", "e1", "e2", "e3", "e4"]
    with Ledger(tmp_path / "fresh.db") as fresh:
        report = fresh.append_many(rows)  # the flat arrays and counts are checked, then agree
        assert report.ok, report.rejected
        assert fresh.query() == originals
    assert export_jsonl(filled, tmp_path / "r2.jsonl", run_id="r2", valid=True) == 1
    assert [r["episode_id"] for r in read_jsonl(tmp_path / "r2.jsonl")] == ["e4"]


def test_read_jsonl_bad_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(ContractError, match="bad.jsonl:2"):
        read_jsonl(p)


def test_export_parquet_round_trip(filled, tmp_path):
    originals = filled.query()
    path = tmp_path / "out.parquet"
    assert export_parquet(filled, path, batch_size=2) == 5  # 3 row groups
    table = pq.read_table(path)
    assert table.schema.equals(parquet_schema(), check_metadata=False)
    assert table.schema.field("token_ids").type == pa.list_(pa.int32())
    assert table.schema.field("action_mask").type == pa.list_(pa.int8())
    assert table.schema.field("logprobs").type == pa.list_(pa.float32())
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    cols = table.to_pydict()
    for i, t in enumerate(originals):
        assert cols["episode_id"][i] == t.episode_id and cols["seed"][i] == t.seed
        assert cols["token_ids"][i] == t.token_ids
        assert cols["action_mask"][i] == t.action_mask
        assert cols["token_versions"][i] == t.token_versions
        assert cols["policy_versions"][i] == t.policy_versions
        assert cols["logprobs"][i] == pytest.approx(t.logprobs, rel=1e-6, abs=1e-7)
        assert json.loads(cols["reward_components"][i]) == t.reward_components
        assert cols["reward"][i] == t.reward and cols["stop_reason"][i] == t.stop_reason.value
        assert cols["valid"][i] == t.valid and cols["num_tokens"][i] == t.num_tokens
        assert Trajectory.from_dict(json.loads(cols["record"][i])) == t
    # a Parquet row (float32 logprobs) re-enters a ledger: the record plus its flat arrays
    with Ledger(tmp_path / "fresh.db") as fresh:
        for i in range(table.num_rows):
            d = json.loads(cols["record"][i])
            d.update(
                {k: cols[k][i] for k in ("token_ids", "action_mask", "logprobs", "token_versions")}
            )
            fresh.append(d)
        assert fresh.query() == originals


def test_export_empty(ledger, tmp_path):
    assert export_parquet(ledger, tmp_path / "e.parquet") == 0
    assert pq.read_table(tmp_path / "e.parquet").num_rows == 0
    assert (
        export_jsonl(ledger, tmp_path / "e.jsonl") == 0 and read_jsonl(tmp_path / "e.jsonl") == []
    )


# ---------------------------------------------------------------------------------------
# Properties: nothing but ContractError comes out, and nothing is lost

_ids = count()
_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
_KEYS = list(valid_dict()) + list(EXPORT_FIELDS)
_garbage = st.recursive(
    _leaf,
    lambda c: (
        st.lists(c, max_size=4)
        | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=8), c, max_size=5)
    ),
    max_leaves=25,
)
_FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _poke(d: dict, where: str, key: str, value: Any) -> None:
    """Set d[key] (where='top'), or the key in a segment/turn (where='segment'/'turn')."""
    if where == "top":
        d[key] = value
    else:
        target = d["segments"][1] if where == "segment" else d["turns"][0]
        target[key] = value


@st.composite
def _poked(draw: Any) -> dict:
    """A valid record (dict or export row) with one field replaced by garbage."""
    d = _row(f"p{next(_ids)}") if draw(st.booleans()) else valid_dict(f"p{next(_ids)}")
    where = draw(st.sampled_from(["top", "segment", "turn"]))
    keys = {"top": list(d), "segment": ["kind", "token_ids", "logprobs", "policy_version"],
            "turn": list(d["turns"][0])}[where]
    _poke(d, where, draw(st.sampled_from(keys)), draw(_garbage))
    return d


@_FAST
@given(items=st.lists(_garbage | _poked(), min_size=1, max_size=4))
def test_garbage_never_escapes(items):
    with Ledger(":memory:") as led:
        for item in items:
            try:
                led.append(item)
            except ContractError as e:
                assert e.rule in RULES
        assert led.count() + len(led.rejections()) == len(items)
        report = led.append_many(items)  # again, in one batch: now all stored ones are duplicates
        assert len(report.accepted) + len(report.rejected) == len(items)
        assert led.count() + len(led.rejections()) == 2 * len(items)


_WRONG_TYPES: dict[str, list[Any]] = {
    "episode_id": [5, None, [], True], "task_id": [None, 3], "seed": ["1234", 1.5, None, True],
    "reward": ["0.9", None, True, []], "terminated": [1, "true", None], "truncated": [0, None],
    "segments": [{}, "x", None], "turns": [{}, 3], "messages": ["hi", {}, [1]],
    "stop_reason": [3, "Finished!", [], ""], "reward_components": [[], "x", {"outcome": "1"}],
    "timings": [[1], {"t": "fast"}], "metadata": [[], "x"], "run_id": [None, 3],
    "verifier_version": [None, 1],
}
_REQUIRED = ["episode_id", "task_id", "group_id", "split", "env_name", "env_version", "seed",
             "segments", "turns", "messages", "terminated", "truncated", "reward"]


@st.composite
def _mutation(draw: Any) -> tuple[dict, str | None]:
    """(a broken record, the rule it must name or None for 'any rule')."""
    as_row = draw(st.booleans())
    d = _row(f"m{next(_ids)}") if as_row else valid_dict(f"m{next(_ids)}")
    kind = draw(st.sampled_from(["drop", "type", "truncate", "null_version", "flip", "segment_type"]
                                + (["flat_truncate", "flat_mask"] if as_row else [])))
    action = draw(st.sampled_from([1, 3]))  # the two action segments
    if kind == "drop":
        key = draw(st.sampled_from([*_REQUIRED, "stop_reason"]))
        del d[key]
        return d, "missing_stop_reason" if key == "stop_reason" else "schema"
    if kind == "type":
        key = draw(st.sampled_from(sorted(_WRONG_TYPES)))
        d[key] = draw(st.sampled_from(_WRONG_TYPES[key]))
        return d, None  # schema, or a semantic rule for e.g. stop_reason=None
    if kind == "segment_type":
        key, bad = draw(st.sampled_from([("kind", 5), ("token_ids", "abc"), ("logprobs", "x"),
                                         ("policy_version", "3"), ("policy_version", 2.0),
                                         ("token_ids", [1, "2"])]))
        d["segments"][action][key] = bad
        return d, None
    if kind == "truncate":
        d["segments"][action]["logprobs"] = d["segments"][action]["logprobs"][
            : -draw(st.integers(1, 3))
        ]
        return d, "logprobs_length"
    if kind == "null_version":
        d["segments"][action]["policy_version"] = None
        return d, "action_without_version"
    if kind == "flip":
        for flag in draw(
            st.sampled_from([["terminated"], ["truncated"], ["terminated", "truncated"]])
        ):
            d[flag] = not d[flag]
        return d, "termination_flags"
    if kind == "flat_truncate":
        key = draw(st.sampled_from(["token_ids", "action_mask", "logprobs", "token_versions"]))
        d[key] = d[key][:-1]
        return d, "flat_length_mismatch"
    i = draw(st.integers(0, len(d["action_mask"]) - 1))
    d["action_mask"][i] = 1 - d["action_mask"][i]
    return d, "mask_mismatch"


@_FAST
@given(mutated=_mutation())
def test_mutations_are_refused_and_neighbours_kept(mutated):
    bad, rule = mutated
    before, after = valid_dict(f"ok{next(_ids)}"), make_traj(f"ok{next(_ids)}")
    with Ledger(":memory:") as led:
        with pytest.raises(ContractError) as e:
            led.append(copy.deepcopy(bad))
        assert e.value.rule in RULES and (rule is None or e.value.rule == rule), str(e.value)
        report = led.append_many([before, bad, after])
        assert report.accepted == (before["episode_id"], after.episode_id)
        assert [r.index for r in report.rejected] == [1] and report.rejected[0].rule == e.value.rule
        assert led.get(after.episode_id) == after and led.count() == 2
        assert len(led.rejections()) == 2

