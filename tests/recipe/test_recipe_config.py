"""TrainConfig validation of what would make a run learn nothing without an error."""

from __future__ import annotations

import pytest

from taurl.errors import ConfigError
from taurl.recipe.config import TrainConfig
from taurl.recipe.validate import load_config


@pytest.mark.parametrize("temperature", [0, 0.0, -0.5])
def test_training_at_temperature_zero_is_refused_with_why_and_how_to_fix(temperature):
    """Greedy rollouts make the G episodes of a group identical: every group is dropped as
    zero-variance and every update skipped. Before, the run went through and learned nothing."""
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, data={"temperature": temperature})
    text = str(e.value)
    assert "temperature must be > 0 to train" in text and "identical" in text
    assert "eval_temperature: 0" in text  # the fix for a user who wants greedy evaluation


def test_greedy_evaluation_stays_allowed():
    cfg = load_config(TrainConfig, data={"eval_temperature": 0.0})
    assert cfg.eval_temperature == 0.0 and cfg.learner_config().temperature == 1.0


def test_the_episode_budgets_have_one_set_of_defaults():
    """`taurl train`, `taurl rollout` and the agent loop share one declaration of the budget
    defaults (before: three declarations, two sets: a trained policy was rolled out with
    twice its action budget and three times its episode budget)."""
    import subprocess
    import sys

    from taurl.recipe.config import ROLLOUT_BUDGETS, RolloutRunConfig
    from taurl.rollout.loop import RolloutConfig

    loop = {k: getattr(RolloutConfig(), k) for k in ROLLOUT_BUDGETS}
    for cfg in (TrainConfig(), RolloutRunConfig()):
        assert {k: getattr(cfg, k) for k in ROLLOUT_BUDGETS} == loop
        assert cfg.rollout_config() == RolloutConfig(temperature=cfg.temperature)
    # the config stays light: its defaults come from a module without torch
    code = "import sys, taurl.recipe.config; assert 'torch' not in sys.modules, 'torch imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
