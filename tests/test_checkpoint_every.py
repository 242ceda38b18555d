"""checkpoint_every: k (taurl.recipe.loop): a checkpoint every k RL updates and at the last;
the updates between serve their weights without one; optimizer state only in the newest; a
run killed between checkpoints redoes the lost updates from the ledger and ends where an
uninterrupted run ends, bit for bit, without writing any metrics row twice. Every RL row
carries the peak RSS of each phase."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from tests.test_resume import CFG

from taurl.data.runs import RunDir
from taurl.errors import ConfigError
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train
from taurl.recipe.validate import load_config

EVERY = dataclasses.replace(CFG, checkpoint_every=2, updates=3, keep_checkpoints=0)


class Crash(Exception):
    pass


def _rl_rows(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "rl"]


def _weights(run: RunDir, v: int) -> dict[str, torch.Tensor]:
    return load_file(str(run.checkpoint(v) / "model.safetensors"))


def test_checkpoints_every_k_updates_and_a_killed_run_ends_where_a_whole_one_does(
    tmp_path, one_thread
):
    whole = tmp_path / "whole"
    train(EVERY, str(whole), progress=False)
    run = RunDir(whole)
    # v1 SFT; update 1 -> v2 (served only), update 2 -> v3 (checkpoint), update 3 -> v4 (the last)
    assert run.versions() == [0, 1, 3, 4]
    assert [p.name for p in (whole / "checkpoints").iterdir() if p.name.startswith(".served")] == []
    assert (
        not (run.checkpoint(3) / "optimizer.pt").exists()
        and (run.checkpoint(4) / "optimizer.pt").is_file()
    )
    rows = _rl_rows(whole)
    assert [r["update"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["mem/rollout_peak_rss_mb"] > 50 and r["mem/learn_peak_rss_mb"] > 50
        assert r["mem/checkpoint_peak_rss_mb"] > 50 and r["time/checkpoint_s"] >= 0

    # die after update 3's rollouts: update 3 is lost, v3 is the newest checkpoint
    def hook(name, info):
        if name == "rollouts_stored" and info["update"] == 3:
            raise Crash("killed")

    killed = tmp_path / "killed"
    with pytest.raises(Crash):
        train(EVERY, str(killed), progress=False, hook=hook)
    assert RunDir(killed).versions() == [0, 1, 3]
    first = [r["update"] for r in _rl_rows(killed)]
    assert first == [1, 2]
    train(EVERY, str(killed), progress=False)
    assert [r["update"] for r in _rl_rows(killed)] == [1, 2, 3]  # none twice
    a, b = _weights(run, 4), _weights(RunDir(killed), 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_killed_before_the_first_checkpoint_redoes_the_served_update_without_a_second_row(tmp_path):

    def hook(name, info):  # update 1 was served (v2, no checkpoint) and its row written
        if name == "update_done" and info["update"] == 1:
            raise Crash("killed")

    run_dir = tmp_path / "run"
    with pytest.raises(Crash):
        train(EVERY, str(run_dir), progress=False, hook=hook)
    assert RunDir(run_dir).versions() == [0, 1]
    assert [r["update"] for r in _rl_rows(run_dir)] == [1]
    train(EVERY, str(run_dir), progress=False)
    assert [r["update"] for r in _rl_rows(run_dir)] == [1, 2, 3]


def test_checkpoint_every_is_validated():
    with pytest.raises(ConfigError, match="checkpoint_every must be an integer >= 1"):
        load_config(TrainConfig, {"checkpoint_every": 0})
    with pytest.raises(ConfigError, match="checkpoint_every > 1 runs with schedule: sync"):
        load_config(TrainConfig, {"checkpoint_every": 3, "schedule": "async"})
