"""`taurl export --merged RUN_OR_CKPT OUT`: a policy as a plain Hugging Face directory.

A LoRA checkpoint holds an adapter that names its base (`taurl.policy.adapter`); anything
outside taurl wants one directory of weights. This writes the checkpoint's policy, with
any adapter merged in, as ``config.json`` + ``model.safetensors`` + tokenizer files, which
``AutoModelForCausalLM.from_pretrained(OUT)`` loads with no taurl and no peft. A full
checkpoint is written the same way (a copy). ``taurl.json`` keeps the checkpoint's recipe and
version (for `taurl eval OUT`) and where the export came from; the adapter entry is dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from taurl.errors import Error


def source_checkpoint(run_or_ckpt: str | Path) -> Path:
    """The checkpoint to export: `run_or_ckpt` itself, or a run's newest checkpoint."""
    from taurl.data.runs import RunDir

    path = Path(run_or_ckpt)
    if (path / "config.json").is_file():
        return path
    if (path / "checkpoints").is_dir():
        latest = RunDir(path).latest_checkpoint()
        if latest is not None:
            return latest
    raise Error(f"{str(path)!r} is neither a checkpoint (config.json) nor a run directory with "
                "checkpoints; pass RUN or RUN/checkpoints/vN")


def export_merged(run_or_ckpt: str | Path, out: str | Path) -> tuple[Path, dict[str, Any]]:
    """Write the merged policy of `run_or_ckpt` into the new directory `out`; (source, meta).

    Refused before anything is written when `out` exists and is not empty, or the source
    cannot be loaded (an adapter whose base is gone or changed, no peft installed).
    """
    from taurl.policy.files import load_policy_meta, save_policy
    from taurl.policy.model import load_policy, policy_problems

    src = source_checkpoint(run_or_ckpt)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise Error(f"{str(out)!r} exists and is not an empty directory; export into a new "
                    "directory")
    if problems := policy_problems(src):
        raise Error(f"cannot export {str(src)!r}: " + "; ".join(problems))
    model, tok = load_policy(src)
    meta = {
        k: v
        for k, v in load_policy_meta(src).items()
        if k not in ("lora", "metrics_row", "taurl_version")
    }
    meta["exported_from"] = str(src.resolve())
    meta["merged_adapter"] = (src / "adapter_config.json").is_file()
    save_policy(model, tok, out, meta)
    return src, meta
