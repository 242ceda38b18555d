"""The policy: a locally trained tokenizer and small Qwen2 models in plain HF directories."""

from taurl.policy.files import load_policy_meta, save_policy
from taurl.policy.model import (
    SIZES,
    ModelSize,
    build_default_policy,
    count_parameters,
    create_policy,
    load_policy,
    policy_problems,
    tiny_config,
)
from taurl.policy.tokenizer import (
    ACTION_TAGS,
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    build_tokenizer,
    load_tokenizer,
    save_tokenizer,
    wrap_tokenizer,
)

__all__ = [
    "ACTION_TAGS",
    "CHAT_TEMPLATE",
    "SIZES",
    "SPECIAL_TOKENS",
    "ModelSize",
    "build_default_policy",
    "build_tokenizer",
    "count_parameters",
    "create_policy",
    "load_policy",
    "load_policy_meta",
    "load_tokenizer",
    "policy_problems",
    "save_policy",
    "save_tokenizer",
    "tiny_config",
    "wrap_tokenizer",
]
