"""The policy model: small Qwen2 decoders created from scratch, saved and loaded as plain HF dirs.

A policy directory is an ordinary Hugging Face model directory (config.json,
model.safetensors, generation_config.json, tokenizer files) plus ``taurl.json``, a small
file of taurl metadata such as the policy version. Anything that reads HF directories
(``AutoModelForCausalLM``, vLLM, SGLang) loads it with no taurl import, and `load_policy`
loads any local HF causal-LM directory.

Input and output embeddings are never tied: vLLM's in-place weight reload skips
``lm_head`` when embeddings are tied, so a tied policy would serve stale output weights
after an update.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
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
        model.save_pretrained(tmp)
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


def load_policy(
    path: str | Path, device: str | torch.device = "cpu", *, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) from any local HF causal-LM directory; model in eval mode."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{str(path)!r} is not a model directory (no config.json); create one with "
            "taurl.policy.build_default_policy or point to a local HF model directory"
        )
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if len(tokenizer) > model.config.vocab_size:
        raise ConfigError(
            f"tokenizer in {str(path)!r} has {len(tokenizer)} tokens but the model's "
            f"vocabulary is {model.config.vocab_size}; save the matching tokenizer with the model"
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
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerBase]:
    """Train a tokenizer on `texts`, create a `size` policy, save both at `path` as version 0."""
    tokenizer = build_tokenizer(texts, vocab_size)
    model = create_policy(tokenizer, size, seed)
    save_policy(model, tokenizer, path, {"policy_version": 0, "size": size, "seed": seed})
    return model, tokenizer
