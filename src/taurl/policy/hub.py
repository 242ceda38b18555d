"""Models named by a Hugging Face hub id: found in the local HF cache, or downloaded.

Split from `taurl.policy.sources` (which resolves every kind of model spec): this module
is the one that talks to the hub (reachability, the offline switches, snapshots).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def hub_problems(hub_id: str) -> list[str]:
    """Why `hub_id` cannot be loaded here (not cached, and the hub switched off or out of reach)."""
    if hub_cached(hub_id) is not None:
        return []
    hint = f" (if you meant a local directory: {hub_id!r} does not exist)"
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or \
            os.environ.get("TRANSFORMERS_OFFLINE", "").lower() in ("1", "true", "yes"):
        return [f"model {hub_id!r} is a Hugging Face hub id, it is not in the local HF cache and "
                "the hub is switched off here (HF_HUB_OFFLINE); download it where the hub is "
                "reachable and give its directory, or use a GGUF file or a registry model (`taurl "
                "models list`)" + hint]
    if not hub_reachable():
        return [f"model {hub_id!r} is a Hugging Face hub id, it is not in the local HF cache and "
                "huggingface.co cannot be reached from here (3 s timeout); give a local directory, "
                "a GGUF file or a registry model (`taurl models list`)" + hint]
    return []


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether huggingface.co answers a TCP connect within `timeout` seconds."""
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def hub_cached(hub_id: str) -> Path | None:
    """The local HF cache's snapshot of `hub_id`, or None (never downloads)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(hub_id, local_files_only=True))
    except Exception:  # any miss (not cached, incomplete): the caller says what to do
        return None


def hub_snapshot(hub_id: str) -> Path:
    """The cached snapshot of `hub_id`, else a download of its model and tokenizer files."""
    from huggingface_hub import snapshot_download

    cached = hub_cached(hub_id)
    if cached is not None:
        return cached
    patterns = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model", "*.txt"]
    return Path(snapshot_download(hub_id, allow_patterns=patterns, etag_timeout=5))
