"""Tracking sinks (taurl.monitor.sinks): a real tiny run with `trackers: [tensorboard, wandb]`
writes TensorBoard event files and an offline W&B run whose values equal metrics.jsonl;
an unknown or uninstalled tracker is refused, with the install command, before any file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from taurl.errors import ConfigError
from taurl.monitor import sinks
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train
from taurl.recipe.validate import load_config

pytest.importorskip(
    "tensorboard", reason="the [track] extra (pip install 'taurl[track]') is not installed"
)
pytest.importorskip(
    "wandb", reason="the [track] extra (pip install 'taurl[track]') is not installed"
)

from test_alarms import TINY  # noqa: E402  (and registers echotrap-v0)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tracked") / "run"
    train(
        TrainConfig(**TINY, updates=2, trackers=["tensorboard", "wandb"]),
        str(run_dir),
        progress=False,
    )
    return run_dir


def jsonl_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as tag -> [(step, value)], the sinks' naming (``<phase>/<key>``)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for tag, v in sinks.scalars(row).items():
            out.setdefault(tag, []).append((row["step"], v))
    return out


def test_tensorboard_events_equal_metrics_jsonl(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tracked / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    want = jsonl_scalars(tracked)
    assert (
        "rl/rollout/reward_mean" in want
        and "sft/sft/loss" in want
        and "eval_holdout-final/eval/success" in want
    )
    assert set(acc.Tags()["scalars"]) == set(want)
    for tag, points in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], tag
        # event files store float32
        assert all(
            math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
            for (_, a), (_, b) in zip(got, points, strict=True)
        ), tag


def test_wandb_offline_run_equals_metrics_jsonl(tracked):
    runs = sorted((tracked / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1  # offline: the run lives in the run directory, nothing was synced
    history = sinks.read_wandb_history(runs[0])
    rows = [json.loads(x) for x in (tracked / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == len(rows)
    for h, row in zip(history, rows, strict=True):
        phase = row["phase"]
        assert h[f"{phase}/step"] == row["step"]
        for tag, v in sinks.scalars(row).items():
            assert h[tag] == pytest.approx(v, rel=1e-12, abs=1e-12), tag
    assert sum("rl/alarm/reward_std_collapse" in h for h in history) == 2  # the alarms' metrics too


def test_read_wandb_history_rejects_another_file(tmp_path):
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(b"not a wandb file")
    with pytest.raises(ValueError, match="not a W&B run file"):
        sinks.read_wandb_history(bad)


@pytest.mark.parametrize("trackers, message", [
    (["tensorbord"], "did you mean 'tensorboard'"),
    (["wandb", "wandb"], "named twice"),
])
def test_bad_trackers_are_refused(trackers, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, {"trackers": trackers})


def test_a_missing_package_names_the_install_command(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    assert sinks.tracker_problems(["wandb"]) == [
        f"trackers: wandb needs the 'wandb' package, which is not installed: {sinks.INSTALL}"]
    from taurl.cli.main import main

    rc = main(["train", "--run-dir", str(tmp_path / "r"), "--trackers", '["wandb"]'])
    err = capsys.readouterr().err
    assert rc != 0 and "pip install 'taurl[track]'" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()
