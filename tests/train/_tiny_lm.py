"""The learner tests' policy: a one-layer Qwen2 small enough to update in milliseconds."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_lm(vocab_size: int, max_positions: int = 256) -> Qwen2ForCausalLM:
    """Seeded (torch.manual_seed(0)), eval mode; pad id 0, EOS id 1."""
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, max_position_embeddings=max_positions,
        pad_token_id=0, eos_token_id=1,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()
