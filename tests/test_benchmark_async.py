"""benchmarks/async.py: one JSON object per line per schedule; --real needs its harness."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "async.py"
KEYS = {
    "schedule", "eta", "trained_tokens_per_s", "speedup_vs_sync", "max_staleness",
    "learner_idle_frac", "generator_bubble_frac", "staleness_mean", "staleness_p95",
    "tokens_wasted", "length_bias",
}


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_async", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sim_prints_one_json_row_per_schedule(bench, capsys):
    rc = bench.main(
        ["--sim", "--updates", "3", "--eta", "2", "--workload", '{"max_gen_tokens": 2048}']
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # 8 + 2 capped (one batch: 64)
    assert rc == 0 and len(rows) == 10 and all(set(r) >= KEYS for r in rows)
    assert [r["schedule"] for r in rows if "cap" in r["schedule"]] == [
        "async(eta=1,interrupt,cap=64)",
        "async(eta=2,interrupt,cap=64)",
    ]
    assert rows[0]["schedule"] == "sync" and rows[0]["speedup_vs_sync"] == 1.0
    assert all(r["max_staleness"] <= r["eta"] for r in rows)


def test_sim_max_batch_0_leaves_the_capped_rows_out(bench, capsys):
    rc = bench.main(
        ["--sim", "--updates", "2", "--max-batch", "0", "--workload", '{"max_gen_tokens": 1024}']
    )
    assert rc == 0 and not any(
        "cap" in json.loads(x)["schedule"] for x in capsys.readouterr().out.splitlines()
    )


def test_sim_refuses_unknown_workload_fields(bench, capsys):
    assert bench.main(["--sim", "--workload", '{"gen_sigmaa": 1}']) == 2
    assert "unknown: ['gen_sigmaa']" in capsys.readouterr().err


def test_real_without_its_harness_says_so(bench, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "REAL", tmp_path / "_async_real.py")
    assert bench.main(["--real"]) == 2
    assert "_async_real.py does not exist in this checkout" in capsys.readouterr().err


def test_real_prints_the_harness_rows(bench, capsys, monkeypatch, tmp_path):
    fake = tmp_path / "_async_real.py"
    fake.write_text(
        "def run_real(args):\n    return [{'schedule': 'sync', 'eta': 0, 'rest': args.rest}]\n"
    )
    monkeypatch.setattr(bench, "REAL", fake)
    assert bench.main(["--real", "--tool-latency", "0.2"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "schedule": "sync",
        "eta": 0,
        "rest": ["--tool-latency", "0.2"],
    }
