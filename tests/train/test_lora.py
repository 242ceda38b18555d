"""LoRA (taurl.train.lora, taurl.policy.adapter) on tiny Llama and Qwen2 models built from a config.

What is checked: the merged weights the engines serve give the learner's unmerged forward
to 1e-4; a checkpoint holds the adapter and what rebuilds the policy (no copy of the base);
the KL reference is the base read through the same weights (no second copy); a resumed
adapter and its optimizer continue bit for bit; bad options are refused before any file.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from taurl.data.runs import RunDir
from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.errors import ConfigError
from taurl.policy.engine import LocalEngine
from taurl.policy.files import save_policy
from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import load_policy
from taurl.policy.tokenizer import build_tokenizer
from taurl.recipe.config import TrainConfig
from taurl.recipe.validate import load_config
from taurl.train import lora
from taurl.train.checkpoint import load_optimizer_state, save_checkpoint
from taurl.train.learner import Learner, LearnerConfig

pytest.importorskip("peft")

TOL = 1e-4  # fp32, CPU: merged vs unmerged forward
OPTS = lora.LoraOptions(rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(
        ["Lyon is a city in France.", "Which country is Porto in?"] * 20, vocab_size=300
    )


def _base(arch: str, tok):
    ids = {
        "vocab_size": len(tok),
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
    }
    shape = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 256,
    }
    config = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch](
        **shape, **ids, tie_word_embeddings=False
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config).eval()


def _traj(model, name: str, action: list[int], reward: float, prompt=(5, 6, 7, 8)) -> Trajectory:
    lp = sequence_logprobs(model, [*prompt, *action])[len(prompt):].tolist()
    return Trajectory(
        episode_id=name,
        run_id="r",
        task_id="g",
        group_id="g",
        split="train",
        env_name="toy-v0",
        env_version="0",
        seed=0,
        segments=(Segment("prompt", tuple(prompt)), Segment("action", tuple(action), tuple(lp), 0)),
        turns=(Turn(0, "a", {"kind": "answer"}, "", 1, None, "eos"),),
        messages=({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}),
        terminated=True,
        truncated=False,
        stop_reason=StopReason.ANSWERED,
        reward=reward,
    )


def _batch(model, shift: int = 0) -> list[Trajectory]:
    return [
        _traj(model, f"e{shift}-{i}", [10 + i + shift, 20 + i, 30 + shift, 40 + i], float(i % 2))
        for i in range(4)
    ]


def _trained(arch: str, tok, updates: int = 3, **cfg):
    """A LoRA model after `updates` GRPO steps (so B != 0), and its learner."""
    model = lora.attach(_base(arch, tok), OPTS, seed=0)
    learner = Learner(model, LearnerConfig(lr=5e-2, **cfg), pad_id=tok.pad_token_id)
    for u in range(updates):
        learner.update(_batch(model, u), version=0)
    return model, learner


def _run_with_adapter(tmp_path, arch: str, tok):
    """checkpoints/v1: the base (full); checkpoints/v2: the trained adapter, as the
    recipe writes them."""
    run = RunDir.create(str(tmp_path / "run"))
    base = _base(arch, tok)
    save_checkpoint(run, 1, base, tok, None, phase="sft")
    model, learner = _trained(arch, tok)
    meta = lora.checkpoint_meta(run, 1, OPTS)
    save_checkpoint(run, 2, model, tok, learner.optimizer, phase="rl", lora=meta)
    return run, model, learner


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_merged_weights_serve_the_unmerged_forward(arch, tok, tmp_path):
    run, model, _ = _run_with_adapter(tmp_path, arch, tok)
    ids = list(range(3, 40))
    model.eval()
    unmerged = sequence_logprobs(model, ids)
    base = sequence_logprobs(_base(arch, tok), ids)
    assert float((unmerged - base).abs().max()) > 1e-3, (
        "the adapter did not move the policy: the test is void"
    )

    merged, _ = load_policy(run.checkpoint(2))  # what evaluation and `make_engine` load
    assert not lora.is_lora(merged) and type(merged).__name__.lower().startswith(arch)
    assert float((sequence_logprobs(merged, ids) - unmerged).abs().max()) <= TOL

    # the local engine's weight update from the adapter checkpoint: the same merged weights
    engine = LocalEngine(_base(arch, tok), tok, version=1, max_batch_size=2, seed=0)
    asyncio.run(engine.load_weights(run.checkpoint(2), 2))
    assert float((sequence_logprobs(engine.model, ids) - unmerged).abs().max()) <= TOL


def test_checkpoint_holds_the_adapter_and_what_rebuilds_the_policy(tok, tmp_path):
    run, model, _ = _run_with_adapter(tmp_path, "llama", tok)
    ckpt = run.checkpoint(2)
    files = {p.name for p in ckpt.iterdir()}
    assert {
        "adapter_config.json", "adapter_model.safetensors", "config.json", "taurl.json",
    } <= files
    assert "model.safetensors" not in files and "README.md" not in files
    meta = json.loads((ckpt / "taurl.json").read_text())["lora"]
    assert meta["base"] == "../v1" and len(meta["base_sha256"]) == 64 and meta["rank"] == OPTS.rank
    adapter_bytes = (ckpt / "adapter_model.safetensors").stat().st_size
    n_adapter = sum(p.numel() for p in lora.trainable(model))
    assert adapter_bytes < 4 * n_adapter + 100_000  # the adapter in fp32, not the base
    assert adapter_bytes < (run.checkpoint(1) / "model.safetensors").stat().st_size / 5
    assert run.versions() == [1, 2]  # a whole checkpoint for retention and resume

    # a changed base is refused instead of serving the adapter on weights it was not trained on
    other = _base("llama", tok)
    with torch.no_grad():
        other.lm_head.weight.add_(1.0)
    save_policy(other, tok, run.checkpoint(1))
    with pytest.raises(ConfigError, match="not the one it was trained on"):
        load_policy(ckpt)


def _big_storages(min_numel: int) -> set[int]:
    """Distinct storages of every live tensor with at least `min_numel` elements."""
    gc.collect()
    out = set()
    with warnings.catch_warnings():  # isinstance on some module objects warns of deprecations
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and obj.numel() >= min_numel:
                out.add(obj.untyped_storage().data_ptr())
    return out


def test_kl_reference_is_the_base_with_adapters_off_and_no_second_copy(tok):
    base = _base("llama", tok)
    ref_model = copy.deepcopy(base)
    model = lora.attach(base, OPTS, seed=0)
    emb = model.get_input_embeddings().weight.numel()
    before = _big_storages(emb)
    learner = Learner(model, LearnerConfig(lr=5e-2, kl_coef=0.1), pad_id=tok.pad_token_id)
    assert learner.reference is None and learner.reference_is_base
    assert _big_storages(emb) == before  # no copy of the (embedding-sized) weights was made
    # the counter can see one: an explicit reference copy adds storages
    twin = copy.deepcopy(ref_model)
    assert len(_big_storages(emb) - before) >= 2
    del twin
    # the optimizer holds the adapters alone
    held = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for n, p in model.named_parameters() if "lora_" in n}

    m1 = learner.update(_batch(model), version=0)  # B = 0: policy = base, KL = 0
    assert m1["learn/kl_k3"] == pytest.approx(0.0, abs=1e-7)
    m2 = learner.update(_batch(model, 1), version=0)
    assert m2["learn/kl_k3"] > 1e-6  # the adapters moved the policy away from the base
    # the reference read through the adapters-off forward is the untouched base
    rows_lp = learner._reference_logprobs([_rows(_batch(model, 1), tok)])[0]
    want = learner_free_logprobs(ref_model, _rows(_batch(model, 1), tok))
    assert float((rows_lp - want).abs().max()) <= 1e-6


def _rows(trajs, tok):
    from taurl.train.rows import make_rows

    return make_rows(trajs, None, tok.pad_token_id)


def learner_free_logprobs(model, rows):
    from taurl.train.rows import action_logprobs

    with torch.no_grad():
        return action_logprobs(model, rows)[0]


def test_resume_restores_adapters_and_optimizer_bitwise(tok, tmp_path, one_thread):
    cfg = LearnerConfig(lr=5e-2, kl_coef=0.05)
    straight = lora.attach(_base("qwen2", tok), OPTS, seed=0)
    ls = Learner(straight, cfg, pad_id=tok.pad_token_id)
    b1, b2 = _batch(straight, 0), _batch(straight, 1)  # behaviour logprobs of the initial policy
    ls.update(b1, version=0)
    ls.update(b2, version=0)

    run = RunDir.create(str(tmp_path / "run"))
    save_checkpoint(run, 1, _base("qwen2", tok), tok, None, phase="sft")
    first = lora.attach(_base("qwen2", tok), OPTS, seed=0)
    lf = Learner(first, cfg, pad_id=tok.pad_token_id)
    lf.update(b1, version=0)
    save_checkpoint(
        run, 2, first, tok, lf.optimizer, phase="rl", lora=lora.checkpoint_meta(run, 1, OPTS)
    )

    resumed, _ = lora.rl_policy(run, 2, 1, OPTS, seed=0)
    lr_ = Learner(resumed, cfg, pad_id=tok.pad_token_id)
    assert load_optimizer_state(run.checkpoint(2), lr_.optimizer)
    lr_.update(b2, version=0)

    a = dict(straight.named_parameters())
    b = dict(resumed.named_parameters())
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = ls.optimizer.state_dict()["state"], lr_.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


def test_bad_lora_options_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(
            TrainConfig,
            {"lora": {"rank": 0, "alpha": -1, "dropout": 1.5, "targets": [], "size": 3}},
        )
    text = str(e.value)
    for part in ("lora.rank", "lora.alpha", "lora.dropout", "lora.targets", "unknown option"):
        assert part in text
    with pytest.raises(ConfigError, match=r"\['query_key_value'\] name no layer of the model"):
        load_config(TrainConfig, {"lora": {"rank": 4, "targets": ["q_proj", "query_key_value"]}})
    with pytest.raises(ConfigError, match="critic"):
        load_config(TrainConfig, {"lora": {"rank": 4}, "estimator": "gae"})
    from taurl.recipe.loop import train

    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="lora.rank"):
        train(TrainConfig(lora={"rank": "8"}), str(run_dir), progress=False)
    assert not run_dir.exists()


def test_export_merged_is_a_plain_hf_directory(tok, tmp_path):
    from taurl.cli.main import main

    run, model, _ = _run_with_adapter(tmp_path, "llama", tok)
    out = tmp_path / "exported"
    # RUN: its newest checkpoint, v2
    assert main(["export", "--merged", str(run.root), str(out)]) == 0
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(out).eval()  # no taurl, no peft involved
    assert type(plain).__name__ == "LlamaForCausalLM"
    ids = list(range(3, 40))
    model.eval()
    assert float((sequence_logprobs(plain, ids) - sequence_logprobs(model, ids)).abs().max()) <= TOL
    assert json.loads((out / "taurl.json").read_text())["policy_version"] == 2
    # a non-empty OUT is refused before anything is written; so is a path that is no checkpoint
    assert main(["export", "--merged", str(run.checkpoint(2)), str(out)]) == 1  # an error, said
    assert main(["export", "--merged", str(tmp_path / "nothing"), str(tmp_path / "o2")]) == 1
    assert not (tmp_path / "o2").exists()


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """The miniature recipe with ``lora:`` and a KL term, from the miniature's SFT policy (LoRA
    on the from-scratch tiny model learns too little for reward variance)."""
    from tests.test_recipe import MINI

    from taurl.recipe.loop import train

    tmp = tmp_path_factory.mktemp("lora-recipe")
    train(TrainConfig(**{**MINI, "updates": 1}), str(tmp / "sft"), progress=False)
    cfg = {
        **MINI,
        "model": str(tmp / "sft" / "checkpoints" / "v1"),
        "sft": "none",
        "warmup_options": {},
        "expert_options": {},
        "lora": {"rank": 8, "alpha": 16},
        "kl_coef": 0.05,
        "lr": 1e-2,
    }
    summary = train(TrainConfig(**cfg), str(tmp / "run"), progress=False)
    return RunDir(tmp / "run"), summary


def test_recipe_trains_adapters_serves_them_merged_and_evaluates(lora_run):
    """RL checkpoints are adapters on v1, and the engine's behaviour logprobs of update 2
    (sampled with v2 served merged) match the learner's unmerged forward (``mismatch/abs_max``)."""
    run, summary = lora_run
    assert run.versions() == [0, 1, 2, 3] and summary["train"]["updates"] == 2
    assert (run.checkpoint(1) / "model.safetensors").is_file()  # the SFT policy, full: the RL base
    for v in (2, 3):
        assert (
            lora_files(run.checkpoint(v)) and not (run.checkpoint(v) / "model.safetensors").exists()
        )
    assert (
        not (run.checkpoint(2) / "optimizer.pt").exists()
        and (run.checkpoint(3) / "optimizer.pt").is_file()
    )
    rows = [r for r in map(json.loads, run.metrics.read_text().splitlines()) if r["phase"] == "rl"]
    assert [r["update"] for r in rows] == [1, 2]
    assert rows[0]["learn/skipped"] == 0.0, "no reward variance in update 1: the test is void"
    assert "learn/kl_k3" in rows[0]  # the KL term ran (0 at the first step: B = 0, policy = base)
    assert rows[1]["mismatch/abs_max"] <= TOL
    ids = list(range(3, 60))  # ... and v2, which the engine served merged, is not its base
    v1, v2 = (sequence_logprobs(load_policy(run.checkpoint(v))[0], ids) for v in (1, 2))
    assert float((v2 - v1).abs().max()) > 1e-3
    assert summary["holdout"]["final"]["episodes"] == summary["holdout"]["sft"]["episodes"] > 0


def test_merged_export_gives_the_runs_recorded_logprobs(lora_run, tmp_path):
    """The final policy exported merged, loaded by plain transformers, scores the tokens the
    run sampled with it (its final evaluation's episodes) as they were recorded, within 1e-4."""
    from taurl.data.ledger import Ledger
    from taurl.policy.export import export_merged

    run, summary = lora_run
    export_merged(run.root, tmp_path / "final")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "final").eval()
    with Ledger(run.ledger) as ledger:
        sampled = [
            t
            for t in ledger.query(min_version=3)
            if t.policy_versions and set(t.policy_versions) == {3}
        ]
    assert sampled, "no episode of the final version in the ledger"
    temp = summary["config"]["eval_temperature"]
    worst = 0.0
    for t in sampled:
        mask = torch.tensor(t.action_mask, dtype=torch.bool)
        got = sequence_logprobs(plain, t.token_ids, temperature=temp)[mask]
        worst = max(worst, float((got - torch.tensor(t.logprobs)[mask]).abs().max()))
    assert worst <= TOL


def lora_files(path) -> bool:
    return (path / "adapter_config.json").is_file() and (
        path / "adapter_model.safetensors"
    ).is_file()


def test_a_reloading_server_gets_a_merged_copy_outside_the_checkpoint(tok, tmp_path):
    """vLLM reloads weights from a directory: `serving_dir` gives an adapter checkpoint's merged
    copy (a plain HF directory beside the checkpoints, the older one removed)."""
    from taurl.policy.adapter import serving_dir

    run, model, learner = _run_with_adapter(tmp_path, "qwen2", tok)
    assert serving_dir(run.checkpoint(1)) == run.checkpoint(1)  # a full checkpoint serves itself
    served = serving_dir(run.checkpoint(2))
    assert served.parent.name == ".merged" and run.versions() == [1, 2]
    plain = AutoModelForCausalLM.from_pretrained(served).eval()
    ids = list(range(3, 40))
    model.eval()
    assert float((sequence_logprobs(plain, ids) - sequence_logprobs(model, ids)).abs().max()) <= TOL
    learner.update(_batch(model, 7), version=0)
    save_checkpoint(run, 3, model, tok, None, phase="rl", lora=lora.checkpoint_meta(run, 1, OPTS))
    assert serving_dir(run.checkpoint(3)).is_dir() and not served.exists()
