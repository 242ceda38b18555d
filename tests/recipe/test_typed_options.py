"""Options whose keys taurl fixes are typed records: the file writes a mapping, the config
holds an instance of the option class (``cfg.rl.dpo.beta``), an unknown key is refused with
the nearest one and a wrong type by name, before any file is written; every shipped config
and every YAML block of the docs still loads, and a run recorded before resumes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from taurl.cli.main import main
from taurl.errors import ConfigError
from taurl.eval.promote import PromotionConfig
from taurl.recipe.config import RolloutRunConfig, TrainConfig
from taurl.recipe.resume import check_resume, run_identity
from taurl.recipe.validate import dump_config, load_config
from taurl.rollout.options import CompactionConfig, RejectionOptions
from taurl.train.stage_options import DistillOptions, DPOOptions

ROOT = Path(__file__).resolve().parents[2]

# (the file's lines, a misspelt key, the suggestion, a key of the wrong type)
TYPED = [
    ("rollout:\n  compaction: {X}", "keep_turn", "keep_turns", "trigger"),
    ("sft:\n  rejection: {X}", "bukets", "buckets", "rounds"),
    ("rl:\n  dpo: {X}", "bta", "beta", "beta"),
    ("rl:\n  distill: {X}", "los", "loss", "reward_weight"),
    ("promotion: {X}", "margn", "margin", "margin"),
    ("train:\n  ray: {X}", "bundl", "bundle", "ready_timeout_s"),
]


@pytest.mark.parametrize("text, typo, near, _", TYPED)
def test_an_unknown_key_is_refused_with_the_nearest_before_any_file(tmp_path, capsys, text,
                                                                    typo, near, _):
    (tmp_path / "c.yaml").write_text(text.replace("X", f"{typo}: 1"))
    run = tmp_path / "run"
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"unknown option '{typo}'; did you mean '{near}'?" in err, err[-600:]
    assert not run.exists()  # refused before any work or file


@pytest.mark.parametrize("text, _, __, key", TYPED)
def test_a_value_of_the_wrong_type_is_refused(tmp_path, text, _, __, key):
    (tmp_path / "c.yaml").write_text(text.replace("X", f"{key}: [1, 2]"))
    with pytest.raises(ConfigError, match=rf"\.?{key} must be (int|float)"):
        load_config(TrainConfig, path=tmp_path / "c.yaml")


def test_the_run_reads_records_and_the_file_keeps_its_mappings(tmp_path):
    cfg = load_config(TrainConfig, data={
        "rollout": {"compaction": {"policy": "drop", "keep_turns": 2}},
        "sft": {"data": "rejection", "rejection": {"rounds": 2}}, "promotion": {"margin": 0.1}})
    assert cfg.compaction == CompactionConfig(policy="drop", keep_turns=2)
    assert cfg.promotion.margin == 0.1 and cfg.sft.rejection == RejectionOptions(rounds=2)
    assert cfg.rl.dpo == DPOOptions() and cfg.rl.distill == DistillOptions()
    assert cfg.rollout_config().compaction is cfg.compaction
    written = yaml.safe_load(dump_config(cfg))  # the run's config.yaml: the same shape as before
    assert written["rl"]["dpo"] == {} and written["sft"]["rejection"] == {"rounds": 2}
    assert written["rollout"]["compaction"] == {"policy": "drop", "keep_turns": 2}
    assert written["promotion"] == {"margin": 0.1}
    (tmp_path / "config.yaml").write_text(dump_config(cfg))
    assert load_config(TrainConfig, path=tmp_path / "config.yaml") == cfg
    dpo = load_config(TrainConfig, data={"rl": {"objective": "dpo", "dpo": {"beta": 0.5}}})
    assert dpo.rl.dpo.beta == 0.5 and yaml.safe_load(dump_config(dpo))["rl"]["dpo"] == {"beta": 0.5}
    # Python: a mapping or a record, the same config
    assert TrainConfig(rl={"dpo": DPOOptions(beta=0.5)}).rl.dpo == dpo.rl.dpo
    assert TrainConfig(rl={"dpo": {"beta": 0.5}}).rl.dpo == dpo.rl.dpo
    with pytest.raises(ConfigError, match="did you mean 'beta'"):
        TrainConfig(rl={"dpo": {"bta": 0.5}})
    rollout = load_config(RolloutRunConfig, data={"compaction": {"policy": "env"}})
    assert rollout.compaction.on and rollout.rollout_config().compaction.policy == "env"


def test_a_run_recorded_with_its_defaults_written_out_resumes(tmp_path):
    """Shipped configs write ``promotion:`` with every default; a run started before the
    record was typed recorded that mapping in its identity, and resumes with the record."""
    class Env:
        name, version, verifier_version = "search-v0", "1", ""

    cfg = TrainConfig()
    stored = run_identity(cfg, Env())
    stored["config"]["promotion"] = {"margin": 0.0, "max_cost_ratio": 1.5}
    (tmp_path / "state.json").write_text(__import__("json").dumps({"identity": stored}))
    check_resume(tmp_path, run_identity(cfg, Env()))
    changed = TrainConfig(promotion=PromotionConfig(margin=0.2))
    with pytest.raises(Exception, match="promotion"):
        check_resume(tmp_path, run_identity(changed, Env()))


def _doc_blocks() -> list[tuple[str, dict]]:
    out = []
    for md in sorted((ROOT / "docs").rglob("*.md")):
        for block in re.findall(r"```ya?ml\n(.*?)```", md.read_text(), re.S):
            data = yaml.safe_load(block)
            if isinstance(data, dict):
                out.append((str(md.relative_to(ROOT)), data))
    return out


@pytest.mark.parametrize("page, data", _doc_blocks(), ids=[p for p, _ in _doc_blocks()])
def test_every_yaml_block_of_the_docs_loads(page, data):
    from taurl.envs import registry

    if data.get("env") and data["env"] not in registry.registered():
        data = {**data, "env": "search-v0"}  # an env the page registers in its own module
    load_config(TrainConfig, data=data)
