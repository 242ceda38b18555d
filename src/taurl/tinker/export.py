"""A service checkpoint as a plain Hugging Face directory (``taurl export --merged``).

A ``tinker://`` checkpoint (``RUN/tinker/<model>/{sampler_weights,weights}/<name>/``) holds
a LoRA adapter and ``tinker.json``, which names the base model's directory (``base_path``).
The merged export loads that base, merges the adapter in exactly as the service's sampler
does (`taurl.tinker.trainer.sampler_model`: the same weights the engine sampled with), and
writes ``config.json`` + ``model.safetensors`` + tokenizer files, which
``AutoModelForCausalLM.from_pretrained(OUT)`` loads with no taurl and no peft. ``taurl.json``
keeps where it came from: the ``tinker://`` path, the base model and ``version`` (the
optimizer steps the adapter had taken: the ``policy_version`` of the ledger rows its
sampler produced).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from taurl.errors import Error


def is_checkpoint(path: str | Path) -> bool:
    """True for a service checkpoint directory (it holds ``tinker.json``)."""
    return (Path(path) / "tinker.json").is_file()


def checkpoint_directory(run_dir: str | Path, uri: str) -> Path:
    """The directory of the ``tinker://`` path `uri` in the service run `run_dir`."""
    from taurl.tinker import checkpoints
    from taurl.tinker.models import RequestError

    try:
        return checkpoints.existing(uri, Path(run_dir))[1]
    except RequestError as e:
        raise Error(str(e)) from None


def export_merged(directory: str | Path, out: str | Path) -> tuple[Path, dict[str, Any]]:
    """Write checkpoint `directory`, adapter merged into its base, to the new directory `out`.

    Refused before anything is written when `out` exists and is not empty, or the base
    model's directory (``base_path`` in ``tinker.json``) is gone.
    """
    from taurl.policy.files import save_policy
    from taurl.policy.model import load_policy
    from taurl.tinker.models import BaseModel
    from taurl.tinker.trainer import checkpoint_meta, sampler_model

    directory, out = Path(directory), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise Error(f"{str(out)!r} exists and is not an empty directory; export into a new "
                    "directory")
    meta = checkpoint_meta(directory)
    base_path = meta.get("base_path")
    if not base_path or not (Path(base_path) / "config.json").is_file():
        raise Error(f"cannot export {str(directory)!r}: its base model's directory "
                    f"{base_path!r} is gone (tinker.json: base_path)")
    model, tok = load_policy(base_path)
    merged = sampler_model(BaseModel(meta["base_model"], Path(base_path), model, tok), directory)
    record = {"exported_from": meta.get("path"), "base_model": meta["base_model"],
              "base_path": base_path, "version": int(meta.get("steps", 0)),
              "merged_adapter": True, "tinker_lora": meta["lora"]}
    save_policy(merged, tok, out, record)
    return directory, record
