"""One place per option: a new learner option is one field of the rl section's dataclass,
and YAML, Python, the CLI, the reference table and the learner all follow; the old flat
spellings still load, each source with ONE warning naming the new spelling."""

from __future__ import annotations

import dataclasses
import logging
import pickle

import pytest

from taurl.cli.config_flags import config_overrides, options_table
from taurl.cli.main import build_parser
from taurl.errors import ConfigError
from taurl.recipe.config import TrainConfig
from taurl.recipe.options import SECTION_TYPES, RLSection
from taurl.recipe.validate import dump_config, load_config
from taurl.train.learner import Learner, LearnerConfig


@pytest.fixture
def probe_option(monkeypatch):
    """The rl section with one new field, `probe_coef`, added at test time: the only
    declaration the test makes (no loader, flag, docs or learner code is touched)."""
    cls = dataclasses.make_dataclass(
        "RLWithProbe", [("probe_coef", float, dataclasses.field(default=0.5))],
        bases=(RLSection,), frozen=True)
    monkeypatch.setitem(SECTION_TYPES, "rl", cls)
    return cls


def test_a_new_learner_option_is_settable_from_yaml_python_and_cli(probe_option, tmp_path):
    from taurl.api import _prepare

    assert TrainConfig().rl.probe_coef == 0.5  # its default, in one place
    (tmp_path / "c.yaml").write_text("rl:\n  probe_coef: 0.25\n  updates: 3\n")
    from_yaml = load_config(TrainConfig, path=tmp_path / "c.yaml")
    from_python = TrainConfig(rl={"probe_coef": 0.75})
    from_api, _ = _prepare("search-v0", tasks=None, model=None, reward=None, config=None,
                           run_dir=None, overrides={"rl": {"probe_coef": 0.5 + 0.125}})
    args = build_parser().parse_args(["train", "--rl.probe-coef", "0.125", "--rl.lr", "1e-3"])
    from_cli = load_config(TrainConfig, overrides=config_overrides(args, TrainConfig))
    assert (from_yaml.rl.probe_coef, from_yaml.rl.updates) == (0.25, 3)
    assert from_python.rl.probe_coef == 0.75 and from_api.rl.probe_coef == 0.625
    assert (from_cli.rl.probe_coef, from_cli.rl.lr) == (0.125, 1e-3)
    assert "--rl.probe-coef" in build_parser()._subparsers._group_actions[0].choices[
        "train"].format_help()
    assert "| `rl.probe_coef` (`--rl.probe-coef`) | `0.5` |" in options_table(TrainConfig)
    # it is saved in the run's config and read back
    (tmp_path / "saved.yaml").write_text(dump_config(from_cli))
    assert load_config(TrainConfig, path=tmp_path / "saved.yaml").rl.probe_coef == 0.125
    # it reaches the learner's config object as it is
    from tests.train._tiny_lm import tiny_lm

    learner = Learner(tiny_lm(32), from_cli.learner_config())
    assert isinstance(learner.config, LearnerConfig) and learner.config.probe_coef == 0.125
    with pytest.raises(ConfigError, match="rl.probe_coef must be float"):
        load_config(TrainConfig, data={"rl": {"probe_coef": "high"}})


def test_old_flat_cli_flags_and_keywords_load_with_one_warning_each(caplog):
    from taurl.api import _prepare

    args = build_parser().parse_args(["train", "--lr", "1e-3", "--eval-tasks", "5"])
    with caplog.at_level(logging.WARNING, logger="taurl"):
        cfg = load_config(TrainConfig, overrides=config_overrides(args, TrainConfig))
    assert (cfg.rl.lr, cfg.eval.tasks) == (1e-3, 5)
    warned = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(warned) == 1 and "--lr -> --rl.lr" in warned[0]
    assert "--eval-tasks -> --eval.tasks" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="taurl"):
        cfg, _ = _prepare("search-v0", tasks=None, model=None, reward=None, config=None,
                          run_dir=None, overrides={"lr": 2e-3, "group_size": 4})
    assert (cfg.rl.lr, cfg.rl.group_size) == (2e-3, 4)
    warned = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(warned) == 1 and "lr=... -> rl={'lr': ...}" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="taurl"):
        _prepare("search-v0", tasks=None, model=None, reward=None, config=None, run_dir=None,
                 overrides={"rl": {"lr": 2e-3}})
    assert "deprecated" not in caplog.text  # the new spelling: no warning
    args = build_parser().parse_args(["train", "--lr", "1e-3", "--rl.lr", "2e-3"])
    with pytest.raises(ConfigError, match="rl.lr is given twice"):
        config_overrides(args, TrainConfig)


def test_code_written_against_flat_names_keeps_working():
    """Other code reads ``cfg.lr`` and builds ``TrainConfig(lr=...)`` /
    ``dataclasses.replace(cfg, lr=...)``: those keep working, without a warning for now."""
    cfg = TrainConfig(lr=1e-3, eval_tasks=7, sft="none", engine_options={"replicas": 2})
    assert (cfg.rl.lr, cfg.eval.tasks, cfg.sft.data, cfg.engine.options) == (1e-3, 7, "none",
                                                                             {"replicas": 2})
    assert (cfg.lr, cfg.eval_tasks, cfg.sft_data, cfg.model_size) == (1e-3, 7, "", "tiny")
    assert cfg.sft == "none" and cfg.engine == "local" and cfg.schedule != "async"
    later = dataclasses.replace(cfg, lr=2e-3, updates=4)
    assert (later.rl.lr, later.rl.updates, later.eval.tasks) == (2e-3, 4, 7)
    assert dataclasses.replace(cfg, rl=RLSection(lr=3e-3)).lr == 3e-3
    assert TrainConfig(**{"rl.lr": 4e-3}).rl.lr == 4e-3
    assert pickle.loads(pickle.dumps(later)) == later
    with pytest.raises(AttributeError):
        _ = cfg.no_such_option
    with pytest.raises(TypeError, match="no_such_option"):
        TrainConfig(no_such_option=1)


def test_a_run_of_the_flat_release_resumes(tmp_path):
    """Its config.yaml was flat, its identity in state.json flat: both still match."""
    import json

    from taurl.recipe.resume import check_resume, run_identity
    from taurl.recipe.sections import flat_options

    cfg = TrainConfig(rl={"lr": 1e-3}, eval={"tasks": 9})
    flat = flat_options(cfg)
    assert flat["lr"] == 1e-3 and flat["eval_tasks"] == 9 and "rl" not in flat
    env = type("E", (), {"name": "search-v0", "version": "1"})()
    identity = run_identity(cfg, env)
    (tmp_path / "state.json").write_text(json.dumps({"identity": identity}))
    check_resume(tmp_path, run_identity(cfg, env))  # the same run: passes
    with pytest.raises(Exception, match="lr"):
        check_resume(tmp_path, run_identity(dataclasses.replace(cfg, lr=2e-3), env))
    (tmp_path / "config.yaml").write_text("lr: 0.001\neval_tasks: 9\n")  # the flat release's
    assert load_config(TrainConfig, path=tmp_path / "config.yaml") == cfg


@pytest.mark.parametrize("replay, message", [
    ({"capacty": 8}, "rl.replay: unknown option 'capacty'; did you mean 'capacity'?"),
    ({"fraction": "half"}, "rl.replay.fraction must be float"),
    ({"max_age": 0}, "replay: max_age must be >= 1"),  # ReplayConfig.problems()
])
def test_a_typed_mapping_option_is_checked_from_its_option_class(replay, message):
    """``rl.replay`` stays a mapping in the file and a dict in the run, while its keys,
    types and checks come from one class (`ReplayConfig`), as for ``rl.curriculum``."""
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        load_config(TrainConfig, data={"rl": {"replay": replay}})
    ok = load_config(TrainConfig, data={"rl": {"replay": {"capacity": 8},
                                               "curriculum": {"mix": [0.2, 0.6, 0.2]}}})
    assert ok.rl.replay == {"capacity": 8} and ok.replay == {"capacity": 8}
