"""Config files in sections (rl.lr, eval.tasks, ...): every shipped config uses them, flat keys
of earlier files still load with one warning naming each key's new place, and a run's
config.yaml is written in sections and read back unchanged."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from taurl.errors import ConfigError
from taurl.recipe.config import TrainConfig
from taurl.recipe.sections import HOME, SECTIONS, rewrite_in_sections
from taurl.recipe.validate import dump_config, load_config

ROOT = Path(__file__).resolve().parents[2]
FLAT = """# a flat config of the previous release
env: frozenlake-v0
lr: 0.002          # the RL learning rate
sft: none
eval_tasks: 7
engine: local
schedule: sync
max_turns: 2
"""


def test_every_option_has_one_place():
    import dataclasses

    from taurl.recipe.options import SECTION_TYPES, section_fields
    from taurl.recipe.sections import TOP

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert names == set(SECTION_TYPES) | TOP and not set(SECTION_TYPES) & TOP
    places = {f"{s}.{f.name}" for s in SECTION_TYPES for f in section_fields(s)}
    assert set(HOME.values()) <= places  # every old flat name reads an option that exists
    assert len(set(HOME.values())) == len(HOME)  # and no two old names read the same one


def _registry_installed(raw: dict) -> bool:
    from taurl.policy.sources import model_problems, source_kind

    model = (raw.get("policy") or {}).get("model")
    return not model or source_kind(str(model)) != "registry" or not model_problems(str(model))


def test_every_shipped_config_is_in_sections_and_loads_without_a_warning(caplog):
    import yaml

    for path in sorted((ROOT / "configs").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if "game" in raw:  # a self-play file (`python -m taurl.recipe.selfplay`): its own schema
            from taurl.recipe.selfplay import SelfPlayConfig

            SelfPlayConfig.load(path)
            continue
        flat = [
            k for k, v in raw.items() if k in HOME and not (k in SECTIONS and isinstance(v, dict))
        ]
        assert not flat, f"{path.name}: flat keys {flat}"
        # a registry model (configs/real.yaml) needs its optional package; the rest of the file
        # must still load, so without the package the model is swapped for the default policy
        overrides = {} if _registry_installed(raw) else {"model": ""}
        with caplog.at_level(logging.WARNING, logger="taurl"):
            load_config(TrainConfig, path=path, overrides=overrides)
        assert "deprecated" not in caplog.text, path.name


def test_flat_keys_load_with_a_warning_naming_the_new_key(tmp_path, caplog):
    (tmp_path / "flat.yaml").write_text(FLAT)
    (tmp_path / "sections.yaml").write_text(rewrite_in_sections(FLAT))
    with caplog.at_level(logging.WARNING, logger="taurl"):
        old = load_config(TrainConfig, path=tmp_path / "flat.yaml")
    for moved in (
        "lr -> rl.lr", "sft -> sft.data", "eval_tasks -> eval.tasks", "engine -> engine.kind",
        "schedule -> schedule.kind", "max_turns -> rollout.max_turns",
    ):
        assert moved in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="taurl"):
        new = load_config(TrainConfig, path=tmp_path / "sections.yaml")
    assert not caplog.text and new == old
    assert (old.lr, old.sft, old.eval_tasks, old.max_turns) == (0.002, "none", 7, 2)
    assert "# the RL learning rate" in (tmp_path / "sections.yaml").read_text()  # comments kept


def test_a_run_writes_its_config_in_sections_and_reads_it_back(tmp_path):
    cfg = load_config(
        TrainConfig, data={"rl": {"lr": 1e-3, "updates": 4}, "eval": {"tasks": 5}, "seed": 3}
    )
    (tmp_path / "config.yaml").write_text(dump_config(cfg))
    text = (tmp_path / "config.yaml").read_text()
    assert "\nrl:\n" in text and "\neval:\n" in text and "\nlr:" not in text
    assert load_config(TrainConfig, path=tmp_path / "config.yaml") == cfg


@pytest.mark.parametrize("data, message", [
    ({"rl": {"lrr": 1.0}}, "unknown option rl.lrr; did you mean rl.lr?"),
    ({"rl": {"lr": 1e-3}, "lr": 2e-3}, "rl.lr is given twice"),
    ({"eval": {"tasks": "many"}}, "eval.tasks must be int"),
])
def test_section_mistakes_are_named(data, message):
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        load_config(TrainConfig, data=data)


def test_each_section_is_a_typed_dataclass_with_the_flat_configs_defaults():
    """``cfg.section("rl")``: the options of one section of the file, keyed as there, typed
    and frozen; its class's defaults are TrainConfig's (one set of defaults)."""
    import dataclasses
    import typing

    from taurl.recipe.options import section_fields

    cfg = TrainConfig(rl={"lr": 1e-4}, eval={"tasks": 7}, engine={"options": {"replicas": 2}})
    rl, ev, engine = cfg.section("rl"), cfg.section("eval"), cfg.section("engine")
    assert (rl.lr, rl.updates, ev.tasks, engine.options) == (1e-4, 30, 7, {"replicas": 2})
    assert rl is cfg.rl and ev is cfg.eval
    assert (
        typing.get_type_hints(type(rl))["lr"] is float
        and typing.get_type_hints(type(ev))["tasks"] is int
    )
    for name, keys in SECTIONS.items():
        cls = type(cfg.section(name))
        assert [f.name for f in section_fields(name)] == list(keys)
        assert cls() == TrainConfig().section(name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rl.lr = 1.0
    with pytest.raises(ConfigError, match="unknown config section 'evals'"):
        cfg.section("evals")
