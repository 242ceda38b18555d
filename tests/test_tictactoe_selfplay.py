"""The self-play recipe (taurl.recipe.selfplay) end to end on a tiny budget, and its config."""

from __future__ import annotations

import json

import pytest

from taurl.errors import ConfigError
from taurl.recipe.selfplay import SelfPlayConfig, run

CONFIG = "configs/tictactoe_selfplay.yaml"
TINY = ["sft.demos=64", "sft.epochs=2", "rl.updates=2", "rl.tasks_per_update=4",
        "rl.group_size=2", "eval.tasks=6", "eval.trials=1", "game.numbered=true",
        "sft.warmup_demos=8", "eval.extra_holdout={minimax: {opponent: minimax}}",
        "policy.lora={rank: 4, alpha: 8, per_role: true}", "rl.epochs=1"]


def test_the_shipped_config_loads_its_sections_and_refuses_unknown_keys(tmp_path):
    cfg = SelfPlayConfig.load(CONFIG)
    assert cfg.lora == {} and cfg.estimator == "returns" and cfg.rl_epochs == 4
    assert cfg.holdout_opponent != cfg.validation_opponent != cfg.demo_opponent
    # the legal moves on the board; no stage plays the evaluation opponents
    assert cfg.numbered and cfg.validation_opponent["opponent"] == "greedy"
    assert cfg.demo_opponent["opponent"] == "random" and "minimax" in cfg.extra_holdout
    assert cfg.frozen_opponent  # and against the frozen SFT checkpoint
    assert SelfPlayConfig.load(CONFIG, ["rl.updates=3"]).updates == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("rl: {updatez: 3}\n")
    with pytest.raises(ConfigError, match="rl.updatez"):
        SelfPlayConfig.load(bad)


def test_a_tiny_selfplay_run_trains_each_role_and_reuses_its_sft(tmp_path, one_thread):
    cfg = SelfPlayConfig.load(CONFIG, TINY)
    first = run(cfg, tmp_path / "a", log=lambda _: None)
    assert set(first["sft"]) == set(first["rl"]) == {
        "validation", "holdout", "holdout/minimax", "validation/frozen-sft", "holdout/frozen-sft"}
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


def test_the_frozen_sft_opponent_is_a_paired_report_scored_by_the_referee(tmp_path, one_thread):
    cfg = SelfPlayConfig.load(CONFIG, TINY + ["eval.frozen_opponent=true", "rl.kl_coef=0.1"])
    got = run(cfg, tmp_path / "a", log=lambda _: None)
    for split in ("validation", "holdout"):
        key = f"{split}/frozen-sft"
        assert got["sft"][key]["tasks"] == got["rl"][key]["tasks"] == 6
        assert got["paired_gain"][key]["difference"] == pytest.approx(
            got["rl"][key]["success"] - got["sft"][key]["success"])
        # every game ends (won, lost, draw, forfeit) or runs out of its budget: counted
        assert sum(got["rl"][key]["stop_reasons"].values()) == pytest.approx(1.0)


def test_a_match_record_succeeds_only_when_the_referee_ended_it_with_its_win():
    from taurl.data.stop_reason import StopReason
    from taurl.recipe.selfplay import MatchOutcome

    class Record:
        def __init__(self, why):
            self.stop_reason = StopReason(why) if why else None

    verdict = MatchOutcome()
    assert [verdict(Record(w), None) for w in ("won", "lost", "draw", "forfeit", None)] == [
        1.0, 0.0, 0.0, 0.0, 0.0]


def test_full_fine_tuning_with_a_kl_keeps_the_sft_policy_as_its_reference(tmp_path):
    from taurl.policy.model import build_default_policy
    from taurl.recipe.selfplay import SelfPlay

    model, tok = build_default_policy(["x 2 o / 4 5 6 / 7 8 9"] * 4, tmp_path, size="tiny",
                                      vocab_size=300, seed=0)
    cfg = SelfPlayConfig(lora={}, kl_coef=0.1)
    sp = SelfPlay(model, tok, cfg)
    assert sp.learner.reference is not None and sp.learner.reference is not sp.model
    assert SelfPlay(model, tok, SelfPlayConfig(lora={})).learner.reference is None
