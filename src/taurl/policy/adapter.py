"""Adapter checkpoints (LoRA): read, identify their base, and serve them merged.

A LoRA run's RL checkpoint holds what it trained and what is needed to rebuild the policy,
not a copy of the base weights:

    checkpoints/vN/   adapter_config.json, adapter_model.safetensors  (peft's own files)
                      config.json (the base's, a few KB: the architecture), tokenizer files,
                      taurl.json with ``lora: {base, base_sha256, ...}``

``base`` is the base policy directory relative to the checkpoint (``../v1``: the run's SFT
version, which retention always keeps), so a run directory can be moved whole;
``base_sha256`` is the digest of the base's weight files, checked when the adapter is
loaded, so an adapter is never applied to weights it was not trained on.

Everything that serves a policy reads it merged: `load_merged` builds the base, attaches
the adapter and folds it in (``W + (alpha / r) · B A``, peft's ``merge_and_unload``), giving a
plain HF model, so the engines, evaluation and export see an ordinary causal LM.

An engine serves an adapter only as the version it records (`check_served_version`): its
taurl.json's ``policy_version`` is the version every token sampled with it is stamped with,
so a sample can never carry the number of another adapter (or of the base) than the one
whose weights produced it (docs/lora.md: LoRA with the async schedule).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from taurl.errors import ConfigError, EngineError
from taurl.policy.files import load_hf_policy, load_policy_meta, save_policy

ADAPTER_CONFIG = "adapter_config.json"
PEFT_FIX = "pip install 'taurl[real]' (or pip install peft)"

# (file, size, mtime_ns) -> sha256: hash each file once
_digests: dict[tuple[str, int, int], str] = {}


def is_adapter_dir(path: str | Path) -> bool:
    """Whether `path` is an adapter checkpoint (it holds peft's adapter_config.json)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def weights_sha256(path: str | Path) -> str:
    """sha256 over the weight files of the HF directory `path` (``*.safetensors``, by name)."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(_file_sha256(f).encode())
    return h.hexdigest()


def _file_sha256(f: Path) -> str:
    st = f.stat()
    key = (str(f.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
        _digests[key] = h.hexdigest()
    return _digests[key]


def adapter_meta(checkpoint_parent: str | Path, base: str | Path,
                 options: dict[str, Any]) -> dict[str, Any]:
    """The ``lora`` entry of an adapter checkpoint's taurl.json: the base relative to the
    checkpoint's directory (written into `checkpoint_parent`), its digest and the options."""
    rel = os.path.relpath(Path(base).resolve(), Path(checkpoint_parent).resolve())
    return {"base": os.path.join("..", rel), "base_sha256": weights_sha256(base), **options}


def adapter_base(path: str | Path) -> Path:
    """The base policy directory of adapter checkpoint `path` (from its taurl.json)."""
    lora = load_policy_meta(path).get("lora")
    if not isinstance(lora, dict) or "base" not in lora:
        raise ConfigError(f"{str(path)!r} holds an adapter but its taurl.json names no base model "
                          "(lora.base); it was not written by taurl: merge it with peft yourself")
    base = Path(path) / lora["base"]
    return base if base.is_dir() else Path(lora["base"])


def adapter_problems(path: str | Path) -> list[str]:
    """Why adapter checkpoint `path` cannot be loaded (no peft, its base gone or changed)."""
    try:
        import peft  # noqa: F401
    except ImportError:
        return [f"{str(path)!r} is a LoRA adapter checkpoint and loading it needs peft: {PEFT_FIX}"]
    try:
        base = adapter_base(path)
    except ConfigError as e:
        return e.problems
    if not base.is_dir():
        return [f"the base model of adapter {str(path)!r} ({str(base)!r}) is gone; an adapter "
                "checkpoint needs its base (keep the run's SFT checkpoint, or export with "
                "--merged)"]
    want = load_policy_meta(path)["lora"].get("base_sha256")
    if want and weights_sha256(base) != want:
        return [f"the base model of adapter {str(path)!r} ({str(base)!r}) is not the one it was "
                "trained on (its weights' sha256 differs); restore that base or retrain the "
                "adapter"]
    return []


def check_served_version(path: str | Path, version: int) -> None:
    """Refuse to serve adapter checkpoint `path` as policy `version` unless its taurl.json
    records exactly that version (an engine calls this before it swaps weights).

    Why: an engine stamps every sampled token with the version it was told to serve; if that
    number came from anywhere but the adapter's own record (the learner's current version, a
    counter), a stale adapter or the base could sample under a newer number, and the
    importance ratios and staleness of those samples would be silently wrong. A full
    checkpoint is not checked (its weights are the version's whatever its number).
    """
    if not is_adapter_dir(path):
        return
    recorded = load_policy_meta(path).get("policy_version")
    if recorded is None:
        raise EngineError(f"the adapter at {str(path)!r} records no policy_version in its "
                          "taurl.json; an engine serves an adapter only as the version it "
                          f"records, so it will not serve it as version {version} (save it with "
                          "taurl's save_checkpoint)")
    if int(recorded) != int(version):
        raise EngineError(f"the adapter at {str(path)!r} is policy version {recorded}, not "
                          f"{version}: refusing to serve it as a version it does not record (its "
                          "samples would carry the wrong version)")


def load_merged(path: str | Path, device: str | torch.device = "cpu", *,
                dtype: torch.dtype = torch.float32,
                chat_template: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of adapter checkpoint `path`: its base with the adapter merged in.

    The tokenizer is the checkpoint's own (saved with it); the model is a plain HF causal
    LM in eval mode (no peft wrapper left), as `taurl.policy.model.load_policy` returns.
    """
    if problems := adapter_problems(path):
        raise ConfigError(problems)
    from peft import PeftModel

    from taurl.policy.tokenizer import load_tokenizer

    base, _ = load_hf_policy(adapter_base(path), device, dtype=dtype, chat_template=chat_template)
    model = PeftModel.from_pretrained(base, str(path)).merge_and_unload()
    tokenizer = load_tokenizer(path)
    if chat_template is not None:
        from taurl.policy.tokenizer import CHAT_TEMPLATE

        tokenizer.chat_template = CHAT_TEMPLATE if chat_template == "chatml" else chat_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


def serving_dir(path: str | Path) -> Path:
    """A plain HF directory with the weights of checkpoint `path`, for a server that reloads
    from disk (vLLM): `path` itself, or for an adapter checkpoint its merged copy in
    ``<checkpoints>/.merged/<vN>`` (outside the checkpoint, so the checkpoint stays an
    adapter; the previous merged copy is removed: only the served one is kept)."""
    path = Path(path)
    if not is_adapter_dir(path):
        return path
    root = path.parent / ".merged"
    out = root / path.name
    if not (out / "config.json").is_file():
        model, tok = load_merged(path)
        save_policy(model, tok, out, {"merged_from": str(path.resolve())})
    for old in root.iterdir():
        if old.name != path.name:
            shutil.rmtree(old, ignore_errors=True)
    return out
