"""LoRA with the async schedule: every sampled token carries the adapter version that produced it.

The must-show (issue 35, item 4): a ``lora:`` run with ``schedule: async`` of 4 updates at
η = 2 is exported (`taurl export`'s function), each recorded version's merged weights are
rebuilt here from the saved adapter and its base with peft alone (not the engine's code
path), every exported row's sampled tokens are scored with a plain forward, and each
recorded logprob must match within 1e-4 (fp32). The rows must span several versions and
some must have been trained off-policy (staleness >= 1), or the check would be void; and the
versions must differ enough that a sample stamped with a wrong version would be caught.

Also: an engine refuses to serve an adapter as a version the adapter does not record.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from taurl.cli.commands import export
from taurl.data.export import read_jsonl
from taurl.data.runs import RunDir
from taurl.errors import EngineError
from taurl.policy.engine import LocalEngine
from taurl.policy.model import load_policy
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train

pytest.importorskip("peft")

TOL = 1e-4  # fp32 on CPU: the engine's incremental decode vs one plain forward
ETA = 2
TEMPERATURE = 0.8  # recorded logprobs are those of softmax(logits / T)
TASKS = Path(__file__).parent / "fixtures" / "chaos_tasks.jsonl"
# a tiny from-scratch policy (built in the fixture: its tokenizer on the task texts alone), no
# SFT (v1 = v0: the adapters' base); drop_zero_variance off and an entropy bonus, so every
# update takes a step and each version's adapter differs from the one before
CFG = dict(tasks=str(TASKS), sft="none", demos=0, updates=4, tasks_per_update=2, group_size=3,
           eval_tasks=1, eval_trials=1, max_turns=1, max_action_tokens=8, max_episode_tokens=8,
           system_prompt="", concurrency=12,
           schedule="async", staleness_eta=ETA, overprovision=1, drop_zero_variance=False,
           lora={"rank": 4, "alpha": 8}, lr=2e-2, entropy_coef=0.05, keep_checkpoints=0,
           temperature=TEMPERATURE, eval_temperature=TEMPERATURE, alarms={"enabled": False})


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    """A tiny from-scratch policy whose tokenizer is trained on the task texts alone."""
    from taurl.policy.model import build_default_policy

    path = tmp_path_factory.mktemp("async-lora-base") / "v0"
    texts = [t for line in TASKS.read_text().splitlines() for t in _texts(json.loads(line))]
    build_default_policy(texts, path, size="tiny", vocab_size=400)
    return path


@pytest.fixture(scope="module")
def async_lora_run(tmp_path_factory, tiny_base) -> tuple[RunDir, list[dict]]:
    root = tmp_path_factory.mktemp("async-lora") / "run"
    train(TrainConfig(**CFG, model=str(tiny_base)), str(root), progress=False)
    return RunDir(root), _exported(root)


def _exported(root: Path) -> list[dict]:
    path, n = export(root, "jsonl")
    rows = read_jsonl(path)
    assert n == len(rows) > 0
    return rows


def _texts(task: dict) -> list[str]:
    return [task["prompt"], *task["answers"]]


def _merged(run: RunDir, version: int, v_sft: int) -> torch.nn.Module:
    """Version `version`'s policy rebuilt with transformers + peft only: the base (the SFT
    checkpoint) with the version's saved adapter merged in (`merge_and_unload`)."""
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(run.checkpoint(v_sft), dtype=torch.float32)
    if version == v_sft:
        return base.eval()
    return PeftModel.from_pretrained(base, str(run.checkpoint(version))).merge_and_unload().eval()


def _plain_logprobs(model: torch.nn.Module, ids: list[int], temperature: float) -> torch.Tensor:
    """log softmax(logits / T) of each token given the ones before it; entry 0 is 0."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double() / temperature
    picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return torch.cat([torch.zeros(1, dtype=picked.dtype), picked])


def _trained_at(run: RunDir, v_sft: int, updates: int) -> dict[int, int]:
    """group index → the learner version that trained it, from the checkpoints' records (the
    groups consumed by update u are those checkpoint v_sft + u lists and v_sft + u - 1 not)."""
    out, before = {}, set()
    for u in range(1, updates + 1):
        meta = json.loads((run.checkpoint(v_sft + u) / "taurl.json").read_text())
        consumed = set(meta["async_groups"]["consumed"])
        out.update({g: v_sft + u - 1 for g in consumed - before})
        before = consumed
    return out


def _recompute(run: RunDir, rows: list[dict], v_sft: int) -> tuple[float, int, list[float]]:
    """(worst |Δ|, tokens checked, the next version's miss per row and version) of every
    sampled token of `rows` against its recorded version's weights rebuilt by `_merged`."""
    sampled = [r for r in rows if r["source"] == "policy"]
    assert all(r["logprobs"] is not None for r in sampled)
    versions = sorted({v for r in sampled for v in r["token_versions"] if v >= 0})
    models = {v: _merged(run, v, v_sft) for v in versions}
    worst, checked, separation = 0.0, 0, []
    for r in sampled:
        ids, tv = r["token_ids"], torch.tensor(r["token_versions"])
        recorded = torch.tensor(r["logprobs"], dtype=torch.float64)
        for v in sorted(set(tv.tolist()) - {-1}):
            at = tv == v
            got = _plain_logprobs(models[v], ids, TEMPERATURE)
            worst = max(worst, float((got[at] - recorded[at]).abs().max()))
            checked += int(at.sum())
            if v + 1 in models:  # how far the next version's weights would be from the record
                nxt = _plain_logprobs(models[v + 1], ids, TEMPERATURE)
                separation.append(float((nxt[at] - recorded[at]).abs().max()))
    return worst, checked, separation


@pytest.mark.attack  # tests/mutation_check.py learner-version-stamp: must fail
def test_async_lora_rows_match_their_recorded_versions_merged_weights(async_lora_run):
    run, rows = async_lora_run
    v_sft = 1
    assert run.versions() == list(range(0, v_sft + CFG["updates"] + 1))  # every version kept
    sampled = [r for r in rows if r["source"] == "policy"]
    versions = sorted({v for r in sampled for v in r["token_versions"] if v >= 0})
    worst, checked, separation = _recompute(run, rows, v_sft)
    print(f"async LoRA: {len(sampled)} rows, {checked} tokens, versions {versions}, worst |Δ| "
          f"{worst:.2e}, next version's smallest miss {min(separation, default=0):.2e}")
    assert checked > 0 and worst <= TOL, f"{checked} tokens, worst |Δ| = {worst:.2e}"
    # not void: a token stamped with the next version would miss by far more than TOL
    assert separation and min(separation) > 10 * TOL, min(separation, default=None)

    # the RL rows span several adapter versions, and some were trained off-policy (<= η)
    train_rows = [r for r in sampled if r["episode_id"].startswith("a")]
    assert len({v for r in train_rows for v in r["policy_versions"]}) >= 2
    trained_at = _trained_at(run, v_sft, CFG["updates"])
    staleness = [trained_at[int(r["episode_id"][1:6])] - min(r["policy_versions"])
                 for r in train_rows if int(r["episode_id"][1:6]) in trained_at]
    assert len(staleness) == CFG["updates"] * CFG["tasks_per_update"] * CFG["group_size"]
    print(f"staleness of the trained rows: {sorted(staleness)}")
    assert max(staleness) >= 1 and max(staleness) <= ETA and min(staleness) >= 0


def test_an_engine_refuses_an_adapter_version_it_does_not_record(async_lora_run, tmp_path):
    """The engine serves an adapter only as the version its taurl.json records: asked for
    another version (or given an adapter that records none) it raises, and keeps serving
    what it served; asked for the recorded one it swaps and reports it."""
    import asyncio

    run, _ = async_lora_run
    model, tok = load_policy(run.checkpoint(1))
    engine = LocalEngine(model, tok, version=1)
    with pytest.raises(EngineError, match="is policy version 3, not 4"):
        asyncio.run(engine.load_weights(run.checkpoint(3), 4))
    assert engine.version == 1
    bare = tmp_path / "bare"  # the adapter without its recorded version
    shutil.copytree(run.checkpoint(3), bare)
    meta = json.loads((bare / "taurl.json").read_text())
    del meta["policy_version"]
    meta["lora"]["base"] = str(run.checkpoint(1))
    (bare / "taurl.json").write_text(json.dumps(meta))
    with pytest.raises(EngineError, match="records no policy_version"):
        asyncio.run(engine.load_weights(bare, 3))
    # the vLLM engine refuses before it sends anything (no server is needed to see it)
    from taurl.policy.vllm_engine import VLLMEngine

    remote = VLLMEngine("http://127.0.0.1:9", version=1)
    with pytest.raises(EngineError, match="is policy version 3, not 4"):
        asyncio.run(remote.load_weights(run.checkpoint(3), 4))
    assert remote.version == 1
    asyncio.run(engine.load_weights(run.checkpoint(3), 3))
    assert engine.version == 3
    ids = list(range(3, 30))
    want = _plain_logprobs(_merged(run, 3, 1), ids, 1.0)
    assert float((_plain_logprobs(engine.model, ids, 1.0) - want).abs().max()) <= TOL


def test_lora_with_async_is_no_longer_refused_and_the_step_scorer_says_why():
    assert not TrainConfig(lora={"rank": 4}, schedule="async").lora_problems()
    text = " ".join(TrainConfig(lora={"rank": 4}, step_scorer="implicit_prm").lora_problems())
    assert "step scorer starts as a copy of the policy" in text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_async_lora_run_killed_mid_update_resumes_its_adapter_and_versions(tmp_path, tiny_base):
    """SIGKILL in the learner's third optimizer step (v3, update 2's adapter, is on disk);
    the same command again resumes from v3's adapter and its AdamW state, the engine serves
    v3 merged, and every row of both parts still matches its recorded version's weights."""
    import yaml

    from chaos_harness import run_cli  # beside this file

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump({**CFG, "model": str(tiny_base)}))
    argv = ["train", "--config", str(cfg_path), "--run-dir", str(tmp_path / "run"), "--no-progress"]
    assert run_cli(argv, kill_at="learner_step@step=3") not in (0, -9)
    run = RunDir(tmp_path / "run")
    assert run.versions() == [0, 1, 2, 3]
    assert run_cli(argv) == 0
    assert run.versions() == [0, 1, 2, 3, 4, 5]
    worst, checked, _ = _recompute(run, _exported(run.root), 1)
    assert checked > 0 and worst <= TOL, f"{checked} tokens, worst |Δ| = {worst:.2e}"
