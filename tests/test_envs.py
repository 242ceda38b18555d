"""Every registered environment passes check_env; the registry explains its errors."""

from pathlib import Path

import pytest

from taurl.envs import check_env, make, make_tasks, registered
from taurl.errors import ConfigError, UnknownEnvError

# The adapters to other standards have no env without options: each gets the one its own
# tests use (a fixture built from the package's own classes, or a reasoning-gym family).
ADAPTER_CONFIG = {
    "reasoning-gym": ({"dataset": "letter_counting"}, "reasoning_gym"),
    "openenv": ({"app": "openenv_target:app"}, "openenv.core"),
    "verifiers": ({"env_id": "vf-fixture-env", "env_args": {"kind": "single"}}, "verifiers"),
    "textarena": ({"env_id": "TicTacToe-v0"}, "textarena"),
}


@pytest.mark.parametrize("name", registered())
def test_every_registered_env_passes_check_env(name, monkeypatch):
    config, package = ADAPTER_CONFIG.get(name, ({}, None))
    if package:
        pytest.importorskip(package, reason="pip install 'taurl[ecosystem]'")
        monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures"))
    task = make_tasks(name, "train", n=1, seed=0, env_config=config or None)[0]
    check_env(make(name, **config), task)


def test_unknown_env_says_did_you_mean():
    with pytest.raises(UnknownEnvError, match="Did you mean 'search-v0'"):
        make("serch-v0")


def test_task_sources_take_their_own_options_and_name_the_rest():
    tasks = make_tasks(
        "search-v0", "holdout", n=4, seed=0, families=["city_country"], split_by="city"
    )
    assert len(tasks) == 4 and {t.metadata["family"] for t in tasks} == {"city_country"}
    with pytest.raises(
        ConfigError,
        match="search-v0's task source has no option 'level'; "
        "its options: distractors, families, split_by",
    ):
        make_tasks("search-v0", "train", n=1, level="hard")
    with pytest.raises(
        ConfigError, match="code-v0's task source has no option 'split_by'; its options: "
    ):
        make_tasks("code-v0", "train", n=1, split_by="city")


def test_rollout_config_checks_task_options_before_any_work():
    from taurl.recipe.config import RolloutRunConfig

    assert RolloutRunConfig(task_options={"split_by": "city"}).problems() == []
    problems = RolloutRunConfig(task_options={"seed": 3, "levels": 2}).problems()
    assert any("'seed' is not an option" in p for p in problems)
    assert any(
        "no option 'levels'; its options: distractors, families, split_by" in p for p in problems
    )
