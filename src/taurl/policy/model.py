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

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from taurl.errors import ConfigError
from taurl.policy.files import (
    hf_policy_problems,
    load_hf_policy,
    save_policy,
)
from taurl.policy.tokenizer import (
    DEFAULT_MODEL_MAX_LENGTH,
    SPECIAL_TOKENS,
    build_tokenizer,
)


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




def policy_problems(path: str | Path, *, chat_template: str | None = None) -> list[str]:
    """Why `path` cannot serve as a policy, from its files alone (no weights are read): the
    checks of `taurl.policy.files.hf_policy_problems`, and for a LoRA checkpoint
    (`taurl.policy.adapter`) those of the adapter and of its base."""
    path = Path(path)
    if path.is_dir() and (path / "adapter_config.json").is_file():
        # a LoRA checkpoint: its base must load
        from taurl.policy.adapter import adapter_base, adapter_problems

        return adapter_problems(path) or policy_problems(adapter_base(path),
                                                         chat_template=chat_template)
    return hf_policy_problems(path, chat_template=chat_template)


def load_policy(
    path: str | Path, device: str | torch.device = "cpu", *, dtype: torch.dtype = torch.float32,
    chat_template: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) from any local HF causal-LM directory; model in eval mode.

    Any architecture ``AutoModelForCausalLM`` builds (Qwen2, Llama, GPT-2, GPT-NeoX, …), not
    only taurl's own (`taurl.policy.files.load_hf_policy`). A LoRA adapter checkpoint loads as
    its base with the adapter merged in (`taurl.policy.adapter.load_merged`).
    """
    path = Path(path)
    if (path / "adapter_config.json").is_file():
        # a LoRA checkpoint (taurl.policy.adapter): served merged
        from taurl.policy.adapter import load_merged

        return load_merged(path, device, dtype=dtype, chat_template=chat_template)
    return load_hf_policy(path, device, dtype=dtype, chat_template=chat_template)



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
