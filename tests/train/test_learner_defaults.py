"""One set of learner defaults: `LearnerConfig` (the Python API's `Learner`) and the recipe's
`TrainConfig` (YAML, CLI) agree on every option both declare, so a user moving from one to the
other gets the same update (they once differed: lr 1e-3 vs 5e-4)."""

from __future__ import annotations

import dataclasses

from taurl.recipe.config import TrainConfig
from taurl.train.learner import LearnerConfig


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def test_every_shared_learner_option_has_one_default():
    train = {f.name: f for f in dataclasses.fields(TrainConfig)}
    shared = [f for f in dataclasses.fields(LearnerConfig) if f.name in train]
    assert len(shared) >= 20  # the learner's options are declared in both
    differ = {f.name: (_default(f), _default(train[f.name])) for f in shared if _default(f) != _default(train[f.name])}
    assert not differ, f"LearnerConfig vs TrainConfig defaults: {differ}"


def test_the_recipe_hands_its_learner_options_through():
    cfg = TrainConfig()
    lc = cfg.learner_config()
    assert lc.lr == cfg.lr and lc.micro_batch_tokens == cfg.micro_batch_tokens
    assert lc.norm_constant == float(cfg.max_episode_tokens)
