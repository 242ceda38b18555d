"""One declaration per learner option: the recipe's ``rl:`` section *is* the learner's
config (`RLSection` subclasses `LearnerConfig`), and the ``train:`` section inherits the
learner's numerics, so no default can differ between the Python API's `Learner` and the
recipe's YAML / CLI (they once did: lr 1e-3 vs 5e-4, kept equal only by this test)."""

from __future__ import annotations

import dataclasses

from taurl.recipe.config import TrainConfig
from taurl.recipe.options import SECTION_TYPES, RLSection, TrainSection
from taurl.train.learner import LearnerConfig
from taurl.train.learner_config import LearnerNumerics


def test_every_learner_option_is_declared_once():
    assert issubclass(RLSection, LearnerConfig) and issubclass(TrainSection, LearnerNumerics)
    # its options; the fields marked set_by (temperature, ...) are set by the run from the
    # option of another section (rollout.temperature), not options of their own
    learner = {f.name for f in dataclasses.fields(LearnerConfig) if "set_by" not in f.metadata}
    for name in ("rl", "train"):  # the sections the learner reads (sft.lr is SFT's own option)
        own = set(SECTION_TYPES[name].__dict__.get("__annotations__", {}))  # declared by it
        assert not own & learner, f"{name} re-declares {sorted(own & learner)}"
    numerics = {f.name for f in dataclasses.fields(LearnerNumerics)}
    assert not numerics & set(LearnerConfig.__dict__["__annotations__"])


def test_the_recipe_hands_its_learner_options_through():
    cfg = TrainConfig(rl={"lr": 1e-3, "kl_coef": 0.1}, train={"precision": "bf16-mixed"},
                      rollout={"temperature": 0.7})
    lc = cfg.learner_config()
    assert isinstance(lc, LearnerConfig)
    assert (lc.lr, lc.kl_coef, lc.micro_batch_tokens) == (1e-3, 0.1, cfg.rl.micro_batch_tokens)
    assert (lc.precision, lc.temperature) == ("bf16-mixed", 0.7)
    assert lc.norm_constant == float(cfg.rollout.max_episode_tokens)
    assert LearnerConfig().lr == TrainConfig().rl.lr == 5e-4
