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
    # every sample rewarded 1, so the verifier passes some and the round trains (a stage that
    # keeps nothing fails: taurl.recipe.stage_loops)
    s = taurl.train(EchoEnv, tasks=tasks(), reward=lambda traj, task: 1.0, run_dir=tmp_path / "rs",
                    progress=False, **{**SMALL, **options})
    assert s["train"]["stage"] == "rejection" and len(_rows(tmp_path / "rs", "rejection")) == 1
    assert s["train"]["rejection"][0]["kept"] > 0


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


# ---------------------------------------------------------------------------------------
# Offline DPO keeps checkpoints as the RL loop does


def _dir_bytes(path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_offline_dpo_keeps_checkpoints_as_rl_does(tmp_path):
    """Offline DPO wrote weights and optimizer state at every update and never pruned: disk
    grew with the updates. It keeps v0, the SFT version and the newest keep_checkpoints, the
    optimizer state in the newest only."""
    from taurl.api import _env_name
    from taurl.data.export import export_jsonl
    from taurl.data.ledger import Ledger
    from taurl.data.runs import RunDir

    base = tmp_path / "base"
    taurl.train(EchoEnv, tasks=tasks(), reward=length_reward, run_dir=base, progress=False, **SMALL)
    data = tmp_path / "episodes.jsonl"
    assert export_jsonl(Ledger(RunDir(base).ledger), data) > 0
    # the records name the env class's id; the run registers EchoEnv with its reward
    name = _env_name(EchoEnv, length_reward)
    rows = [{**json.loads(x), "env_name": name} for x in data.read_text().splitlines()]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = {"sft": "none", "objective": "dpo", "dpo": {"data": str(data)}, "updates": 6,
               "tasks_per_update": 1,
               "keep_checkpoints": 2, "model": str(base / "checkpoints/v1")}
    run = tmp_path / "dpo"
    s = taurl.train(EchoEnv, tasks=tasks(), reward=length_reward, run_dir=run, progress=False,
                    **{**SMALL, **options})
    assert s["train"]["stage"] == "dpo" and s["train"]["updates"] == 6
    assert RunDir(run).versions() == [0, 1, 6, 7]  # v0, SFT (v1), the newest two
    with_optimizer = sorted(p.parent.name for p in (run / "checkpoints").glob("*/optimizer.pt"))
    assert with_optimizer == ["v7"]
    # disk: four versions' weights and one optimizer state, whatever the number of updates
    one = _dir_bytes(run / "checkpoints/v1")  # the weights alone
    state = _dir_bytes(run / "checkpoints/v7") - one  # the newest one's optimizer state
    assert state > 0 and _dir_bytes(run / "checkpoints") <= 4 * one + state + 64 * 1024
    assert [r["update"] for r in _rows(run, "rl")] == [1, 2, 3, 4, 5, 6]


def test_rejection_with_engine_vllm_asks_the_factory_for_vllm(tmp_path, monkeypatch):
    """engine: vllm was handed to a local engine (its url refused as an unknown option). The
    rejection stage now asks the factory for the configured engine (vLLM itself cannot run
    here: the factory call is recorded and stopped)."""
    from taurl.recipe import collectors

    asked = []

    def record(kind, checkpoint_dir, tok, *, version, **options):
        asked.append((kind, options))
        raise RuntimeError("stop here")

    monkeypatch.setattr(collectors, "make_engine", record)
    options = {"sft": "rejection", "engine": "vllm",
               "engine_options": {"url": "http://127.0.0.1:9"},
               "rejection": {"rounds": 1, "attempts": 2, "tasks": 2}}
    with pytest.raises(RuntimeError, match="stop here"):
        taurl.train(EchoEnv, tasks=tasks(), reward=length_reward, run_dir=tmp_path / "rs",
                    progress=False, **{**SMALL, **options})
    (kind, opts), = asked
    assert kind == "vllm" and opts["url"] == "http://127.0.0.1:9" and "device" not in opts
