"""The stages with a loop of their own (taurl.recipe.stage_loops) and the stage checks made at
config validation (taurl.recipe.stages.stage_problems), on the tiny echo env."""

from __future__ import annotations

import json

import pytest

import taurl
from taurl.errors import ConfigError
from test_api import SMALL, EchoEnv, length_reward, tasks


def _rows(run_dir, phase):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == phase]


def test_rejection_builds_its_engine_like_the_rl_loop(tmp_path):
    """engine_options the config accepts are the rejection engine's too: max_batch_size was
    passed twice (TypeError) when the stage built its engine by hand."""
    options = {"sft": "rejection", "engine_options": {"max_batch_size": 8},
               "rejection": {"rounds": 1, "attempts": 2, "tasks": 2}}
    s = taurl.train(EchoEnv, tasks=tasks(), reward=length_reward, run_dir=tmp_path / "rs",
                    progress=False, **{**SMALL, **options})
    assert s["train"]["stage"] == "rejection" and len(_rows(tmp_path / "rs", "rejection")) == 1


def test_rejection_with_the_ray_backend_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="sft: rejection.*backend: ray"):
        taurl.train(EchoEnv, tasks=tasks(), reward=length_reward, run_dir=tmp_path / "rs",
                    progress=False, **{**SMALL, "sft": "rejection", "backend": "ray"})
    assert not (tmp_path / "rs" / "checkpoints").exists()


# ---------------------------------------------------------------------------------------
# Learners that read one token stream per episode, and configs whose episodes are chains


@pytest.mark.parametrize(("options", "learner"), [
    ({"sft": "none", "objective": "dpo", "dpo": {"pairs": "all"}}, "rl.objective: dpo"),
    ({"estimator": "gae"}, "estimator: gae"),
])
def test_a_chain_refusing_learner_with_compaction_is_refused_before_any_work(tmp_path, options,
                                                                           learner):
    """DPO and gae read one token stream per episode; with compaction they failed at their
    first update, after the demonstrations and SFT. Now the config is refused, saying how."""
    with pytest.raises(ConfigError, match="rollout.compaction") as e:
        taurl.train(EchoEnv, tasks=tasks(), reward=length_reward, run_dir=tmp_path / "run",
                    progress=False, **{**SMALL, **options, "compaction": {"policy": "drop"}})
    assert learner in str(e.value) and "drop rollout.compaction" in str(e.value)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_distillation_with_compaction_is_refused_at_validation(tmp_path):
    from taurl.recipe.chain_checks import chain_problems
    from taurl.recipe.config import TrainConfig

    cfg = TrainConfig(env="search-v0", teacher=str(tmp_path), compaction={"policy": "env"})
    assert "rl.teacher (distillation)" in chain_problems(cfg, "distill")[0]
    assert chain_problems(TrainConfig(env="search-v0", teacher=str(tmp_path)), "distill") == []


def test_a_history_rewriting_template_counts_as_a_chain_source(tmp_path):
    """A model whose template drops earlier <think> blocks (Qwen3's) makes a chat env's
    episodes chains: the probe finds it; taurl's own chatml does not."""
    from taurl.policy.tokenizer import build_tokenizer, save_tokenizer
    from taurl.recipe.chain_checks import chain_sources, template_rewrites_history
    from taurl.recipe.config import TrainConfig
    from test_compaction import FIXTURES

    tok = build_tokenizer(["<think>a</think> b q o"] * 10, vocab_size=300)
    save_tokenizer(tok, tmp_path / "chatml")
    tok.chat_template = (FIXTURES / "qwen3_think_template.jinja").read_text()
    save_tokenizer(tok, tmp_path / "qwen3")
    assert not template_rewrites_history(str(tmp_path / "chatml"))
    assert template_rewrites_history(str(tmp_path / "qwen3"))
    cfg = TrainConfig(env="code-v0", model=str(tmp_path / "qwen3"))
    assert any("re-renders history" in s for s in chain_sources(cfg))
    assert chain_sources(TrainConfig(env="search-v0", model=str(tmp_path / "qwen3"))) == []


def test_offline_dpo_on_a_file_of_chains_is_refused(tmp_path):
    from taurl.recipe.chain_checks import chain_problems
    from taurl.recipe.config import TrainConfig

    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"episode_id": "a", "stream_starts": []}) + "\n"
                    + json.dumps({"episode_id": "b", "stream_starts": [{"segment": 3}]}) + "\n")
    cfg = TrainConfig(env="search-v0", objective="dpo", dpo={"data": str(data)})
    assert "(1 rows" in chain_problems(cfg, "dpo")[0]
