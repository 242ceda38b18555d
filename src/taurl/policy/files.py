"""A policy directory on disk: what it must hold, its taurl.json, an atomic save, the plain load.

A policy is an HF causal-LM directory (config.json, weights, tokenizer files with a chat
template) plus taurl's ``taurl.json`` (its version, the recipe that trained it). This module
knows the plain directory only; `taurl.policy.model` adds adapter (LoRA) checkpoints on top
(`taurl.policy.adapter`), so the adapter code can load its base from here without a cycle.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

import taurl
from taurl.errors import ConfigError
from taurl.policy.tokenizer import CHAT_TEMPLATE, load_tokenizer, save_tokenizer

META_FILE = "taurl.json"


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
            if hasattr(model, "get_base_model"):
                # peft adapters alone (taurl.policy.adapter): plus the architecture
                model.get_base_model().config.save_pretrained(tmp)
                # peft's model-card template, for the hub
                (tmp / "README.md").unlink(missing_ok=True)
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


def hf_policy_problems(path: str | Path, *, chat_template: str | None = None) -> list[str]:
    """Why `path` cannot serve as a policy, from its files alone (no weights are read).

    Checks: config.json is present and names a causal-LM model type (one that
    ``AutoModelForCausalLM`` builds, no remote code); weights are present; tokenizer files
    are present; the tokenizer carries a chat template (or `chat_template` is given); it has
    a pad token, or an end token to fall back on. Empty when the directory looks loadable.
    """
    path = Path(path)
    where = str(path)
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
            why = (" (it needs remote code, which taurl never runs)" if config.get("auto_map")
                   else "")
            out.append(f"{where!r}: model_type {kind!r} is not a causal LM that "
                       f"AutoModelForCausalLM builds{why}; use a decoder-only model (e.g. qwen2, "
                       "llama, gpt2, gpt_neox)")
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
    return (bool(tok_cfg.get("chat_template"))
            or _any_file(path, ("chat_template.jinja", "chat_template.json")))


def load_hf_policy(
    path: str | Path,
    device: str | torch.device = "cpu",
    *,
    dtype: torch.dtype = torch.float32,
    chat_template: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) from any local HF causal-LM directory; model in eval mode.

    Any architecture ``AutoModelForCausalLM`` builds (Qwen2, Llama, GPT-2, GPT-NeoX, …), not
    only taurl's own. A LoRA adapter checkpoint loads as its base with the adapter merged
    in (`taurl.policy.adapter.load_merged`). `chat_template`: a Jinja template, or ``"chatml"`` for
    taurl's `CHAT_TEMPLATE`, used when the tokenizer has none (or to replace its own). A tokenizer
    without a pad token pads with its end token (padding is always masked, so any id works).
    """
    path = Path(path)
    if problems := hf_policy_problems(path, chat_template=chat_template):
        raise ConfigError(problems)
    tokenizer = load_tokenizer(path)
    if chat_template is not None:
        tokenizer.chat_template = CHAT_TEMPLATE if chat_template == "chatml" else chat_template
    if not tokenizer.chat_template:  # the files said otherwise; trust what loaded
        raise ConfigError(
            f"the tokenizer in {str(path)!r} has no chat template; {CHAT_TEMPLATE_FIX}"
        )
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
