"""Checkpoints: each policy version is a plain HF directory plus the learner's state.

    checkpoints/v<N>/   config.json, model.safetensors, tokenizer files (`save_policy`),
                        taurl.json (policy_version, phase, update), optimizer.pt (AdamW state;
                        the pipeline keeps it in the newest checkpoint only)

A version is written into ``checkpoints/.v<N>.partial`` and renamed into place only when
complete, so after a crash `RunDir.versions()` lists only whole checkpoints and a restart
resumes from the newest one (weights and optimizer moments both). Any HF causal LM is
saved this way (`save_pretrained` handles its tied or untied embeddings); the optimizer
state is read onto the CPU and moved by the optimizer to wherever its parameters live, so
a run saved on one device resumes on another.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from taurl.policy.model import load_policy, load_policy_meta, save_policy
from taurl.runs import RunDir

OPTIMIZER_FILE = "optimizer.pt"


def save_checkpoint(run: RunDir, version: int, model: torch.nn.Module, tokenizer: Any,
                    optimizer: torch.optim.Optimizer | None = None, *,
                    write_extra: Callable[[Path], None] | None = None, **meta: Any) -> Path:
    """Write policy `version` (and the optimizer state) atomically; returns its directory.

    write_extra(dir) adds what the learner keeps beside the policy (the critic) before the
    rename, so it is part of the same whole-or-nothing checkpoint.
    """
    final = run.checkpoint(version)
    partial = final.with_name(f".v{version}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    save_policy(model, tokenizer, partial, {"policy_version": version, **meta})
    if optimizer is not None:
        torch.save(optimizer.state_dict(), partial / OPTIMIZER_FILE)
    if write_extra is not None:
        write_extra(partial)
    if final.exists():  # a re-run of the same version replaces it whole
        shutil.rmtree(final)
    partial.rename(final)
    return final


def load_checkpoint(path: str | Path, optimizer: torch.optim.Optimizer | None = None, *,
                    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer, meta) of a checkpoint, the model on `device`; loads the optimizer
    state into `optimizer` if saved (`load_state_dict` moves it to the parameters' device)."""
    path = Path(path)
    model, tokenizer = load_policy(path, device, dtype=dtype)
    if optimizer is not None and (path / OPTIMIZER_FILE).exists():
        optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True, map_location="cpu"))
    return model, tokenizer, load_policy_meta(path)


def drop_optimizer_state(path: str | Path) -> None:
    """Delete the optimizer state of checkpoint `path` (its policy stays); twice the model's size."""
    (Path(path) / OPTIMIZER_FILE).unlink(missing_ok=True)
    (Path(path) / "critic" / OPTIMIZER_FILE).unlink(missing_ok=True)  # the critic's (taurl.train.critic)


def load_optimizer_state(path: str | Path, optimizer: torch.optim.Optimizer) -> bool:
    """Load the optimizer state saved with checkpoint `path` into `optimizer`; False if none."""
    f = Path(path) / OPTIMIZER_FILE
    if not f.exists():
        return False
    optimizer.load_state_dict(torch.load(f, weights_only=True, map_location="cpu"))
    return True
