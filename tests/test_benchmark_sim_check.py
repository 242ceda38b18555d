"""benchmarks/async.py --check (benchmarks/_sim_check.py) on run directories written here.

The run directories hold what a real run writes and the check reads (config.yaml,
metrics.jsonl, state.json, the ledger's record column); the decode probe, which needs a
policy, is replaced by fixed timings (the real probe is exercised by the benchmark itself).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from taurl.sim.calibrate import DecodeProbe

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _episode(i: int, calls: int) -> dict:
    segs = [{"kind": "prompt", "token_ids": [1] * 20}]
    turns = []
    for t in range(calls + 1):
        segs.append({"kind": "action", "token_ids": [2] * (10 + i % 7)})
        receipt = {"tool": "search"} if t < calls else None
        turns.append({"index": t, "receipt": receipt})
        if t < calls:
            segs.append({"kind": "observation", "token_ids": [3] * 50})
    return {"segments": segs, "turns": turns}


def _run_dir(root: Path, name: str, schedule: str, eta: int, rows: list[dict], rl_s: float) -> None:
    d = root / name
    d.mkdir(parents=True)
    cfg = {
        "tasks_per_update": 2,
        "group_size": 4,
        "max_episode_tokens": 128,
        "concurrency": 64 if eta == 0 else 48,
        "staleness_eta": eta,
        "interrupt": "interrupt",
        "schedule": schedule,
        "model": str(root / "nowhere"),
        "env_config": {"latency_mean_s": 0.5, "latency_sigma": 1.0, "latency_max_s": 5.0},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"phase": "rl", **r}) + "\n" for r in rows))
    (d / "state.json").write_text(json.dumps({"timings": {"rl": rl_s}}))
    db = sqlite3.connect(d / "ledger.sqlite")
    db.execute("CREATE TABLE trajectories (seq INTEGER, split TEXT, record TEXT)")
    for i in range(32):
        db.execute(
            "INSERT INTO trajectories VALUES (?, 'train', ?)",
            (i, json.dumps(_episode(i, int(i % 4 == 0)))),
        )
    db.execute("INSERT INTO trajectories VALUES (99, 'holdout', ?)", (json.dumps(_episode(0, 3)),))
    db.commit()
    db.close()


def _rows(learn: list[float], update_s: list[float], async_: bool) -> list[dict]:
    out = []
    for i, (ls, us) in enumerate(zip(learn, update_s, strict=True)):
        r = {
            "rollout/episodes": 8,
            "rollout/tokens_mean": 60.0 + 5 * i,
            "rollout/action_tokens_mean": 15.0,
            "time/learn_s": ls,
            "time/checkpoint_s": 0.1,
            "time/update_s": us,
            "time/rollout_s": us - ls - 0.1,
            "rollout/staleness_max": float(min(i, 2) if async_ else 0),
        }
        if async_:
            r["rollout/trained_action_tokens"] = 120.0
            r["time/learner_idle_s"] = 3.0 if i == 0 else 0.0
        out.append(r)
    return out


@pytest.fixture()
def runs(tmp_path):
    _run_dir(
        tmp_path, "sync-0", "sync", 0, _rows([1.0, 1.1, 1.2, 1.3], [3.0, 3.0, 3.2, 3.4], False),
        12.6,
    )
    _run_dir(
        tmp_path, "async-2", "async", 2, _rows([1.5, 1.6, 1.7, 1.8], [5.0, 2.0, 2.0, 2.0], True),
        11.0,
    )
    return tmp_path


def test_check_prints_predicted_vs_measured_per_schedule(runs, monkeypatch, capsys):
    check = _load("_sim_check")
    # fixed timings (module docstring)
    probe = DecodeProbe((1.0, 8.0, 32.0), (0.01, 0.012, 0.02), 1e-5)
    monkeypatch.setattr(check, "probe_decode", lambda policy, prompts: probe)
    p = argparse.ArgumentParser()
    check.add_arguments(p)
    rows = check.run_check(
        p.parse_args(["--from-runs", str(runs), "--etas", "2", "--sim-seeds", "2"])
    )
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    cal = next(r for r in out if r["mode"] == "calibration")
    # 8 of the 32 train episodes
    assert cal["workload"]["max_turns"] == 2 and cal["tool_call_share"] == 0.25
    assert cal["workload"]["max_concurrent"] == 48 and cal["workload"]["tasks_per_batch"] == 2
    # the async run's engine row cap (one batch: 2 tasks × 4) is simulated too
    assert [r["schedule"] for r in rows] == [
        "sync",
        "async(eta=2,interrupt,cap=8)",
        "async(eta=2,interrupt,cap=8)[learner cost of the async run: diagnostic]",
    ]
    sync, asy = rows[0], rows[1]
    assert sync["measured_trained_tokens_per_s"] == pytest.approx(4 * 8 * 15 / 12.6)
    assert asy["measured_trained_tokens_per_s"] == pytest.approx(4 * 120 / 11.0)
    assert asy["measured_speedup_vs_sync"] == pytest.approx((480 / 11.0) / (480 / 12.6))
    assert sync["measured_learner_idle_frac"] == pytest.approx(1 - 4.6 / 12.6)
    assert asy["measured_first_batch_wait_s"] == 3.0 and asy["measured_steady_update_s"] == 2.0
    assert asy["measured_max_staleness"] == 2 and asy["predicted_max_staleness"] <= 2
    for r in rows:
        assert r["ratio_trained_tokens_per_s"] == pytest.approx(
            r["predicted_trained_tokens_per_s"] / r["measured_trained_tokens_per_s"]
        )
    assert sync["predicted_speedup_vs_sync"] == 1.0


def test_check_refuses_several_etas_missing_runs_and_a_used_keep_dir(tmp_path, capsys):
    bench = _load("async")
    assert bench.main(["--check", "--etas", "1", "4", "--from-runs", str(tmp_path)]) == 2
    assert "pass one --etas value" in capsys.readouterr().err
    assert bench.main(["--check", "--from-runs", str(tmp_path)]) == 2
    assert "not a finished run directory" in capsys.readouterr().err
    (tmp_path / "sync-0").mkdir()
    assert bench.main(["--check", "--keep", str(tmp_path)]) == 2  # refused before any run starts
    assert "is not empty: pass a new directory, or --from-runs" in capsys.readouterr().err
