"""TrainConfig validation of what would make a run learn nothing without an error."""

from __future__ import annotations

import pytest

from taurl.errors import ConfigError
from taurl.recipe.config import TrainConfig, load_config


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
