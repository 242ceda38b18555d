"""The policy model: any local HF causal LM, or a small Qwen2 decoder created from scratch.

A policy directory is an ordinary Hugging Face model directory (config.json,
model.safetensors, generation_config.json, tokenizer files) plus ``taurl.json``, a small
file of taurl metadata such as the policy version. Anything that reads HF directories
(``AutoModelForCausalLM``, vLLM, SGLang) loads it with no taurl import, and `load_policy`
loads any local HF causal-LM directory (Qwen2, Llama, GPT-2, GPT-NeoX, …) whose tokenizer
carries a chat template; `policy_problems` says, from the files alone, why one would not.

In the policies taurl creates, input and output embeddings are never tied: vLLM's
in-place weight reload skips ``lm_head`` when embeddings are tied, so a tied policy would
serve stale output weights after an update. A user's model keeps its own choice (GPT-2
ties them); the local engine, the learner and checkpoints handle both.

What "any" covers: decoder-only models whose attention writes through transformers'
``Cache`` (the engine's KV cache, `taurl.policy.kv_cache`). Recurrent or hybrid layers
(Mamba, RWKV, linear attention) keep a state that cache does not hold; they are not
supported by the local engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import taurl
from taurl.errors import ConfigError
from taurl.policy.tokenizer import (
    CHAT_TEMPLATE,
    DEFAULT_MODEL_MAX_LENGTH,
    SPECIAL_TOKENS,
    build_tokenizer,
    load_tokenizer,
    save_tokenizer,
)

META_FILE = "taurl.json"


@dataclass(frozen=True)
class ModelSize:
    """Shape of a Qwen2 decoder. head_dim = hidden_size / num_attention_heads."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int  # grouped-query attention: kv heads shared by q heads
    intermediate_size: int  # SwiGLU width


# Non-embedding parameters per layer ≈ 2h² + 2h·h_kv (attention, h_kv = kv_heads·head_dim)
# + 3h·i (SwiGLU MLP). tiny: 4 × 197k ≈ 0.8M; small: 6 × 983k ≈ 5.9M. Embeddings add
# 2·V·h (untied): 1.0M / 2.1M at V = 4096.
SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(128, 4, 4, 2, 384),  # head_dim 32
    "small": ModelSize(256, 6, 4, 2, 1024),  # head_dim 64
}


@contextlib.contextmanager
def quiet_hf() -> Iterator[None]:
    """transformers' own progress bars off inside (its "Writing model shards" on every checkpoint,
    "Loading weights" on every load): taurl shows one bar per phase, not one per file. The
    setting is restored after, so an application's own transformers calls keep their bars."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def tiny_config(
    vocab_size: int,
    size: str = "tiny",
    *,
    pad_token_id: int = SPECIAL_TOKENS.index("<|endoftext|>"),
    bos_token_id: int = SPECIAL_TOKENS.index("<|endoftext|>"),
    eos_token_id: int = SPECIAL_TOKENS.index("<|im_end|>"),
    max_position_embeddings: int = DEFAULT_MODEL_MAX_LENGTH,
    attn_implementation: str = "sdpa",
) -> Qwen2Config:
    """A Qwen2 config of a named size (`SIZES`), untied, float32.

    The default special ids are those of `build_tokenizer`'s vocabulary; `create_policy`
    passes the tokenizer's own.
    """
    problems = []
    if size not in SIZES:
        problems.append(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    if vocab_size < 1:
        problems.append(f"vocab_size={vocab_size} must be positive (use len(tokenizer))")
    if max_position_embeddings < 1:
        problems.append(f"max_position_embeddings={max_position_embeddings} must be positive")
    for name, tid in (("pad", pad_token_id), ("bos", bos_token_id), ("eos", eos_token_id)):
        if not 0 <= tid < max(vocab_size, 1):
            problems.append(f"{name}_token_id={tid} is outside the vocabulary [0, {vocab_size})")
    if problems:
        raise ConfigError(problems)
    s = SIZES[size]
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=s.hidden_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        intermediate_size=s.intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        dtype="float32",
        attn_implementation=attn_implementation,
    )


def create_policy(
    tokenizer: PreTrainedTokenizerBase, size: str = "tiny", seed: int = 0
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 policy for `tokenizer`; the same seed gives the same weights.

    The global torch RNG is left as it was (the init draws from a forked RNG).
    """
    ids = {name: getattr(tokenizer, f"{name}_token_id") for name in ("pad", "eos")}
    missing = [name for name, tid in ids.items() if tid is None]
    if missing:
        raise ConfigError(
            f"the tokenizer has no {' / '.join(missing)} token; build it with "
            "taurl.policy.build_tokenizer or set tokenizer.pad_token / eos_token"
        )
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else ids["pad"]
    config = tiny_config(
        len(tokenizer),
        size,
        pad_token_id=ids["pad"],
        bos_token_id=bos,
        eos_token_id=ids["eos"],
        max_position_embeddings=min(tokenizer.model_max_length, DEFAULT_MODEL_MAX_LENGTH),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.eval()


def count_parameters(model: torch.nn.Module, *, exclude_embeddings: bool = False) -> int:
    """Number of parameters (shared tensors counted once), optionally without embeddings."""
    skip: set[int] = set()
    if exclude_embeddings and isinstance(model, PreTrainedModel):
        for emb in (model.get_input_embeddings(), model.get_output_embeddings()):
            if emb is not None:
                skip.update(id(p) for p in emb.parameters())
    # parameters() already de-duplicates shared tensors
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def save_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    path: str | Path,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Save model + tokenizer + ``taurl.json`` (`extra`) into one HF directory at `path`.

    Written into a sibling temporary directory and then swapped in, so a reader (an engine
    reloading weights) never sees a half-written policy and no stale file from an earlier
    save survives.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{str(path)!r} is a file; save the policy to a directory path")
    meta = {"taurl_version": taurl.__version__, **(extra or {})}
    try:
        meta_text = json.dumps(meta, indent=2, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"extra metadata must be JSON-serialisable (str/int/float/list/dict): {e}"
        ) from e
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        with quiet_hf():
            model.save_pretrained(tmp)
            if hasattr(model, "get_base_model"):  # peft adapters alone (taurl.policy.adapter): plus the architecture
                model.get_base_model().config.save_pretrained(tmp)
            save_tokenizer(tokenizer, tmp)
        (tmp / META_FILE).write_text(meta_text + "\n", encoding="utf-8")
        _swap_in(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _swap_in(new: Path, path: Path) -> None:
    # A directory cannot be renamed over a non-empty one, so move the old one aside first.
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
    new.rename(path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# Files that hold a tokenizer's vocabulary (fast tokenizer, SentencePiece, GPT-2 BPE, WordPiece).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
CHAT_TEMPLATE_FIX = (
    "set one and save it: `tok = AutoTokenizer.from_pretrained(DIR); tok.chat_template = "
    "open('template.jinja').read(); tok.save_pretrained(DIR)` (or write DIR/chat_template.jinja); "
    "for taurl's ChatML template pass chat_template='chatml' to load_policy"
)


def policy_problems(path: str | Path, *, chat_template: str | None = None) -> list[str]:
    """Why `path` cannot serve as a policy, from its files alone (no weights are read).

    Checks: config.json is present and names a causal-LM model type (one that
    ``AutoModelForCausalLM`` builds, no remote code); weights are present; tokenizer files
    are present; the tokenizer carries a chat template (or `chat_template` is given); it has
    a pad token, or an end token to fall back on. Empty when the directory looks loadable.
    """
    path = Path(path)
    where = str(path)
    if path.is_dir() and (path / "adapter_config.json").is_file():  # a LoRA checkpoint: its base must load
        from taurl.policy.adapter import adapter_base, adapter_problems

        return adapter_problems(path) or policy_problems(adapter_base(path), chat_template=chat_template)
    if not path.is_dir():
        return [f"model directory {where!r} does not exist; point `model` to a local HF "
                "causal-LM directory (config.json, weights, tokenizer files), or create one "
                "with taurl.policy.build_default_policy"]
    out: list[str] = []
    config = _read_json(path / "config.json")
    if config is None:
        out.append(f"{where!r} has no readable config.json; it is not an HF model directory "
                   "(save one with model.save_pretrained(DIR))")
    else:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        kind = config.get("model_type")
        if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            why = " (it needs remote code, which taurl never runs)" if config.get("auto_map") else ""
            out.append(f"{where!r}: model_type {kind!r} is not a causal LM that AutoModelForCausalLM "
                       f"builds{why}; use a decoder-only model (e.g. qwen2, llama, gpt2, gpt_neox)")
    if not _any_file(path, _WEIGHT_FILES):
        out.append(f"{where!r} holds no weights ({' / '.join(_WEIGHT_FILES[::2])}); "
                   "save them with model.save_pretrained(DIR)")
    tok_cfg = _read_json(path / "tokenizer_config.json") or {}
    if not _any_file(path, _TOKENIZER_FILES):
        out.append(f"{where!r} holds no tokenizer files ({', '.join(_TOKENIZER_FILES)}); "
                   "save the model's tokenizer beside it with tokenizer.save_pretrained(DIR)")
    elif chat_template is None and not _has_chat_template(path, tok_cfg):
        out.append(f"the tokenizer in {where!r} has no chat template, and every prompt is "
                   f"rendered with it; {CHAT_TEMPLATE_FIX}")
    special = {**(_read_json(path / "special_tokens_map.json") or {}), **tok_cfg}
    has_eos = special.get("eos_token") or (config or {}).get("eos_token_id") is not None
    if _any_file(path, _TOKENIZER_FILES) and not special.get("pad_token") and not has_eos:
        out.append(f"the tokenizer in {where!r} has neither a pad token nor an end token to pad "
                   "with; set tokenizer.pad_token (or eos_token) and save it")
    return out


def _read_json(f: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _any_file(path: Path, names: Iterable[str]) -> bool:
    return any((path / n).is_file() for n in names)


def _has_chat_template(path: Path, tok_cfg: dict[str, Any]) -> bool:
    # transformers 5 writes chat_template.jinja; older versions a key or chat_template.json
    return bool(tok_cfg.get("chat_template")) or _any_file(path, ("chat_template.jinja", "chat_template.json"))


def load_policy(
    path: str | Path, device: str | torch.device = "cpu", *, dtype: torch.dtype = torch.float32,
    chat_template: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) from any local HF causal-LM directory; model in eval mode.

    Any architecture ``AutoModelForCausalLM`` builds (Qwen2, Llama, GPT-2, GPT-NeoX, …), not
    only taurl's own. A LoRA adapter checkpoint loads as its base with the adapter merged
    in (`taurl.policy.adapter.load_merged`). `chat_template`: a Jinja template, or ``"chatml"`` for taurl's
    `CHAT_TEMPLATE`, used when the tokenizer has none (or to replace its own). A tokenizer
    without a pad token pads with its end token (padding is always masked, so any id works).
    """
    path = Path(path)
    if (path / "adapter_config.json").is_file():  # a LoRA checkpoint (taurl.policy.adapter): served merged
        from taurl.policy.adapter import load_merged

        return load_merged(path, device, dtype=dtype, chat_template=chat_template)
    if problems := policy_problems(path, chat_template=chat_template):
        raise ConfigError(problems)
    tokenizer = load_tokenizer(path)
    if chat_template is not None:
        tokenizer.chat_template = CHAT_TEMPLATE if chat_template == "chatml" else chat_template
    if not tokenizer.chat_template:  # the files said otherwise; trust what loaded
        raise ConfigError(f"the tokenizer in {str(path)!r} has no chat template; {CHAT_TEMPLATE_FIX}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    with quiet_hf():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    vocab = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > vocab:
        raise ConfigError(
            f"tokenizer in {str(path)!r} has {len(tokenizer)} tokens but the model's "
            f"vocabulary is {vocab}; save the matching tokenizer with the model"
        )
    return model.to(device).eval(), tokenizer


def load_policy_meta(path: str | Path) -> dict[str, Any]:
    """The ``taurl.json`` metadata of a policy directory ({} for a directory without one)."""
    meta = Path(path) / META_FILE
    return json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else {}


def build_default_policy(
    texts: Iterable[str],
    path: str | Path,
    size: str = "tiny",
    vocab_size: int = 4096,
    seed: int = 0,
    chat_template: str = "chatml",
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerBase]:
    """Train a tokenizer on `texts`, create a `size` policy, save both at `path` as version 0.
    `chat_template`: chatml or chatml-compact (`taurl.policy.tokenizer.CHAT_TEMPLATES`)."""
    tokenizer = build_tokenizer(texts, vocab_size, chat_template=chat_template)
    model = create_policy(tokenizer, size, seed)
    save_policy(model, tokenizer, path, {"policy_version": 0, "size": size, "seed": seed})
    return model, tokenizer
