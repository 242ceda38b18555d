"""The self-play recipe (taurl.recipe.selfplay) end to end on a tiny budget, and its config."""

from __future__ import annotations

import json

import pytest

from taurl.errors import ConfigError
from taurl.recipe.selfplay import SelfPlayConfig, run

CONFIG = "configs/tictactoe_selfplay.yaml"
TINY = ["sft.demos=64", "sft.epochs=2", "rl.updates=2", "rl.tasks_per_update=4",
        "rl.group_size=2", "eval.tasks=6", "eval.trials=1", "game.numbered=true",
        "sft.warmup_demos=8", "eval.extra_holdout={minimax: {opponent: minimax}}"]


def test_the_shipped_config_loads_its_sections_and_refuses_unknown_keys(tmp_path):
    cfg = SelfPlayConfig.load(CONFIG)
    assert cfg.lora.get("per_role") is True and cfg.estimator == "returns"
    assert cfg.holdout_opponent != cfg.validation_opponent != cfg.demo_opponent
    # the legal moves on the board; no stage plays the evaluation opponents
    assert cfg.numbered and cfg.validation_opponent["opponent"] == "greedy"
    assert cfg.demo_opponent["opponent"] == "random" and "minimax" in cfg.extra_holdout
    assert SelfPlayConfig.load(CONFIG, ["rl.updates=3"]).updates == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("rl: {updatez: 3}\n")
    with pytest.raises(ConfigError, match="rl.updatez"):
        SelfPlayConfig.load(bad)


def test_a_tiny_selfplay_run_trains_each_role_and_reuses_its_sft(tmp_path, one_thread):
    cfg = SelfPlayConfig.load(CONFIG, TINY)
    first = run(cfg, tmp_path / "a", log=lambda _: None)
    assert set(first["sft"]) == set(first["rl"]) == {"validation", "holdout", "holdout/minimax"}
    assert first["rl"]["holdout"]["tasks"] == 6 and len(first["history"]) == 2
    gain = first["paired_gain"]["holdout"]
    assert gain["difference"] == pytest.approx(
        first["rl"]["holdout"]["success"] - first["sft"]["holdout"]["success"])
    # per-role adapters: each round reports each role's own update
    assert all({"x/learn/rows", "o/learn/rows"} <= set(h) for h in first["history"])
    saved = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert saved["sft"] == first["sft"]
    # a second run with the same SFT settings reuses the SFT policy and its evaluations
    logs: list[str] = []
    second = run(cfg, tmp_path / "b", log=logs.append, reuse_sft=tmp_path / "a")
    assert any("reused" in line for line in logs) and second["sft"] == first["sft"]
