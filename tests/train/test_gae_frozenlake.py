"""The must-show of issue 14: ``taurl train --config configs/frozenlake.yaml --estimator gae``
trains end to end (a miniature: the config's settings with a tiny budget on top)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from taurl.cli.main import main
from taurl.train.critic import CRITIC_DIR, WEIGHTS_FILE

ROOT = Path(__file__).resolve().parents[2]


def test_gae_trains_on_the_frozenlake_config(tmp_path):
    run = tmp_path / "run"
    # a multi-turn env (up to 10 moves on 4x4 maps): GAE runs over turns with the critic's bootstrap
    code = main(
        [
            "train", "--config", str(ROOT / "configs" / "frozenlake.yaml"), "--estimator", "gae",
            "--run-dir", str(run), "--demos", "48", "--sft-epochs", "3", "--sft-batch-size", "8",
            "--expert-options", '{"p_random": 0.0}', "--updates", "2", "--tasks-per-update", "2",
            "--group-size", "4", "--eval-tasks", "2", "--eval-trials", "1", "--concurrency", "8",
            "--no-progress",
        ]
    )
    assert code == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train"]["estimator"] == "gae" and summary["train"]["updates"] == 2
    rl = [
        r
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if r["phase"] == "rl"
    ]
    assert [r["update"] for r in rl] == [1, 2]
    assert all(
        math.isfinite(r["learn/vf_loss"]) and math.isfinite(r["learn/value_mean"]) for r in rl
    )
    assert rl[0]["rollout/turns_mean"] > 1  # multi-turn episodes reached the critic
    final = max(int(p.name[1:]) for p in (run / "checkpoints").iterdir())
    assert (run / "checkpoints" / f"v{final}" / CRITIC_DIR / WEIGHTS_FILE).is_file()
