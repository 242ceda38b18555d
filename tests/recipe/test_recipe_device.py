"""The recipe on an explicit device and dtype (`device`, `torch_dtype`): SFT, the learner with
its KL reference, the engine and the evaluations all run there; the CUDA variant runs where a
CUDA device is present and is skipped, saying so, elsewhere."""

from __future__ import annotations

import json

import pytest
import torch
from test_recipe_env_check import TINY  # noqa: F401  (registers checked-answer-v0)

from taurl.policy.model import load_policy
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train

CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device on this machine "
    "(torch.cuda.is_available() is False): the CUDA variant runs where there is one",
)


@pytest.mark.parametrize(
    "device,dtype",
    [
        ("cpu", "bfloat16"),
        pytest.param("cuda", "bfloat16", marks=CUDA),
        pytest.param("cuda", "float32", marks=CUDA),
    ],
)
def test_a_tiny_run_trains_and_evaluates_on_the_configured_device_and_dtype(
    tmp_path, device, dtype
):
    cfg = TrainConfig(**{**TINY, "updates": 2, "kl_coef": 0.05}, device=device, torch_dtype=dtype)
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["train"]["updates"] == 2 and summary["config"]["device"] == device
    rl = [
        r
        for r in map(json.loads, (tmp_path / "run/metrics.jsonl").read_text().splitlines())
        if r["phase"] == "rl"
    ]
    assert len(rl) == 2 and all(
        r.get("learn/kl_k3", 0.0) >= 0 or r.get("learn/skipped") for r in rl
    )
    model, _ = load_policy(tmp_path / "run/checkpoints/v3")
    # loaded back as asked (the default float32)
    assert next(model.parameters()).dtype == torch.float32
    assert (tmp_path / "run/checkpoints/v3/config.json").exists()
