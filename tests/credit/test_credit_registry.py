"""Estimators by name: every registered one runs; bad names and options are reported well."""

from __future__ import annotations

import numpy as np
import pytest

from taurl.credit import (
    ESTIMATORS,
    TurnBatch,
    compute_advantages,
    estimator_names,
    get_estimator,
    make_estimator,
)
from taurl.errors import ConfigError

REQUIRED = {"returns", "orm", "grpo", "dr_grpo", "grpo_batch_std", "rloo", "reinforce_pp",
            "reinforce_pp_baseline", "gae", "gigpo", "segment_grpo", "salt"}


def test_registry_holds_every_required_estimator():
    assert set(estimator_names()) >= REQUIRED


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_runs_documents_its_source_and_zeroes_padding(name):
    rng = np.random.default_rng(1)
    n, t = 24, 5
    b = TurnBatch.build(
        rng.integers(0, 2, n), rng.integers(0, 4, n), num_turns=rng.integers(1, t + 1, n),
        state_hash=rng.integers(0, 3, (n, t)), values=rng.normal(size=(n, t)), max_turns=t,
    )
    c = compute_advantages(b, name)
    assert c.advantages.shape == (n, t) and np.all(np.isfinite(c.advantages))
    assert np.all(c.advantages[~b.turn_mask] == 0)
    assert all(k.startswith("learn/") for k in c.stats)
    doc = get_estimator(name).__doc__ or ""
    module_doc = __import__(get_estimator(name).__module__, fromlist=["_"]).__doc__ or ""
    assert "arXiv" in doc + module_doc or "Williams" in doc, (
        f"{name}: cite the source in the docstring"
    )


def test_unknown_name_suggests_the_closest():
    with pytest.raises(ConfigError, match="Did you mean 'gigpo'"):
        get_estimator("gigp0")


def test_unknown_options_are_all_reported_together():
    with pytest.raises(ConfigError) as e:
        make_estimator("gigpo", omga=2.0, gama=0.9)
    assert len(e.value.problems) == 2
    assert "Did you mean 'omega'" in str(e.value) and "Did you mean 'gamma'" in str(e.value)


def test_options_reach_the_estimator():
    b = TurnBatch.build([1.0], [0], num_turns=[4])
    np.testing.assert_allclose(
        make_estimator("returns", gamma=0.9)(b).advantages[0], [0.729, 0.81, 0.9, 1]
    )
    with pytest.raises(ConfigError, match="gamma"):
        compute_advantages(b, "returns", gamma=1.5)


@pytest.mark.parametrize("name, options, words", [
    ("segment_grpo", {"outcome": "bogus"}, "outcome"),
    ("gae", {"lam": 1.5}, "lam"),
    ("grpo_batch_std", {"eps": -1.0}, "eps"),
    ("gigpo", {"anchor": "fuzzy"}, "anchor"),
])
def test_an_estimator_setting_that_cannot_run_is_refused_at_config_time(name, options, words):
    """Option values only the estimator's body checks are found by a dry run on a probe batch,
    so `taurl train` refuses them before any work (they used to raise at the first update,
    after SFT)."""
    from taurl.credit import estimator_problems
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.validate import load_config

    problems = estimator_problems(name, options)
    assert problems and words in " ".join(problems)
    with pytest.raises(ConfigError, match=words):
        load_config(TrainConfig, data={"estimator": name, "estimator_options": options})
    assert estimator_problems(name, {}) == []


def test_every_registered_estimator_passes_the_dry_run_with_its_defaults():
    from taurl.credit import estimator_names, estimator_problems

    assert {n: estimator_problems(n, {}) for n in estimator_names()} == {
        n: [] for n in estimator_names()
    }
