"""The stages with a loop of their own (taurl.recipe.stage_loops) and the stage checks made at
config validation (taurl.recipe.stages.stage_problems), on the tiny echo env."""

from __future__ import annotations

import json

import pytest

import taurl
from taurl.errors import ConfigError
from test_api import SMALL, EchoEnv, length_reward, tasks


def _rows(run_dir, phase):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == phase]


def test_rejection_builds_its_engine_like_the_rl_loop(tmp_path):
    """engine_options the config accepts are the rejection engine's too: max_batch_size was
    passed twice (TypeError) when the stage built its engine by hand."""
    options = {"sft": "rejection", "engine_options": {"max_batch_size": 8},
               "rejection": {"rounds": 1, "attempts": 2, "tasks": 2}}
    s = taurl.train(EchoEnv, tasks=tasks(), reward=length_reward, run_dir=tmp_path / "rs",
                    progress=False, **{**SMALL, **options})
    assert s["train"]["stage"] == "rejection" and len(_rows(tmp_path / "rs", "rejection")) == 1


def test_rejection_with_the_ray_backend_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="sft: rejection.*backend: ray"):
        taurl.train(EchoEnv, tasks=tasks(), reward=length_reward, run_dir=tmp_path / "rs",
                    progress=False, **{**SMALL, "sft": "rejection", "backend": "ray"})
    assert not (tmp_path / "rs" / "checkpoints").exists()
