"""Checkpoints: each policy version is a plain HF directory plus the learner's state.

    checkpoints/v<N>/   config.json, model.safetensors, tokenizer files (`save_policy`),
                        taurl.json (policy_version, phase, update; an RL one also its
                        update's metrics_row, for `taurl.recipe.record.recover_row`), and in the
                        newest RL checkpoint only: optimizer.pt (AdamW state) and trainer_state.pt
                        (RNG states of python, numpy and torch, the LR scheduler if any)

Atomic (`taurl.data.atomic`): a version is written into ``checkpoints/.v<N>.tmp-<pid>``, every
file and the directory are fsynced, it is renamed into place and the parent is fsynced.
After a kill at any point `RunDir.versions()` lists only whole checkpoints, a restart
removes the leftovers (`RunDir.clean`) and resumes from the newest version: weights,
optimizer moments, RNG states; the data position is the update number (the RL tasks of
update u are fixed by the task plan). A full disk raises `DiskWriteError` and leaves no
partial version behind.

Any HF causal LM is saved this way (`save_pretrained` handles its tied or untied
embeddings); the optimizer state is read onto the CPU and moved by the optimizer to
wherever its parameters live, so a run saved on one device resumes on another.

With ``checkpoint_every: k`` the RL loop checkpoints every k-th update (and the last); the
updates between write their policy alone to ``checkpoints/.served-v<N>`` for the engines
(`save_served`). A restart resumes from the newest checkpoint and redoes the updates after
it on the ledger's stored episodes (same seeds), so it reaches the same weights.

Retention (`prune_checkpoints`): the newest k versions, v0, the SFT version and every
version a promotion made current are kept; the others are deleted whole.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from taurl import chaos
from taurl.data.atomic import fsync_tree, remove_dir, replace_dir, write_error
from taurl.data.runs import RunDir
from taurl.policy.files import load_policy_meta, save_policy
from taurl.policy.model import load_policy

OPTIMIZER_FILE = "optimizer.pt"
TRAINER_STATE_FILE = "trainer_state.pt"


def save_checkpoint(run: RunDir, version: int, model: torch.nn.Module, tokenizer: Any,
                    optimizer: torch.optim.Optimizer | None = None, *, scheduler: Any = None,
                    write_extra: Callable[[Path], None] | None = None,
                    rng: dict[str, Any] | None = None, **meta: Any) -> Path:
    """Write policy `version` (and, with an optimizer, the trainer state) atomically; returns its
    directory.

    write_extra(dir) adds what the learner keeps beside the policy (the critic) before the
    fsync and rename, so it is part of the same whole-or-nothing checkpoint. rng: the RNG
    states to store (`rng_state()` taken when the update ended), for a checkpoint written
    in a background thread while the learner already runs; None takes them now.
    """
    final = run.checkpoint(version)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_policy(model, tokenizer, tmp, {"policy_version": version, **meta})
        chaos.point("checkpoint_files", f"version={version}")
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
            torch.save({"rng": rng if rng is not None else rng_state(),
                        "scheduler": scheduler.state_dict() if scheduler is not None else None},
                       tmp / TRAINER_STATE_FILE)
        if write_extra is not None:
            write_extra(tmp)
        fsync_tree(tmp)
        chaos.point("checkpoint_synced", f"version={version}")
        replace_dir(tmp, final)
    except (OSError, SafetensorError) as e:  # safetensors reports ENOSPC as its own error type
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(f"checkpoint v{version} ({final})", e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


SERVED_PREFIX = ".served-v"  # checkpoints/.served-vN: weights between checkpoints (`save_served`)


def save_served(run: RunDir, version: int, model: torch.nn.Module, tokenizer: Any,
                **meta: Any) -> Path:
    """Write policy `version` for the engines to load, outside the checkpoints: an update that
    is not checkpointed (``checkpoint_every`` > 1). The policy only (with LoRA the adapter), no
    optimizer or RNG state, not fsynced; a sibling of the checkpoints (an adapter's ``../vN``
    base resolves), dot-named (`RunDir.versions` never lists it); the previous one is removed."""
    path = run.root / "checkpoints" / f"{SERVED_PREFIX}{version}"
    save_policy(model, tokenizer, path, {"policy_version": version, "served_only": True, **meta})
    remove_served(run, keep=path)
    return path


def remove_served(run: RunDir, keep: Path | None = None) -> None:
    """Delete the `save_served` directories (all, or all but `keep`)."""
    parent = run.root / "checkpoints"
    if parent.is_dir():
        for p in parent.glob(f"{SERVED_PREFIX}*"):
            if p != keep:
                shutil.rmtree(p, ignore_errors=True)


def load_checkpoint(path: str | Path, optimizer: torch.optim.Optimizer | None = None, *,
                    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer, meta) of a checkpoint, the model on `device`; loads the optimizer
    state into `optimizer` if saved (`load_state_dict` moves it to the parameters' device)."""
    path = Path(path)
    model, tokenizer = load_policy(path, device, dtype=dtype)
    if optimizer is not None and (path / OPTIMIZER_FILE).exists():
        optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True,
                                             map_location="cpu"))
    return model, tokenizer, load_policy_meta(path)


def drop_optimizer_state(path: str | Path) -> None:
    """Delete the trainer state of checkpoint `path` (its policy stays); twice the model's size."""
    (Path(path) / OPTIMIZER_FILE).unlink(missing_ok=True)
    # the critic's (taurl.train.critic)
    (Path(path) / "critic" / OPTIMIZER_FILE).unlink(missing_ok=True)
    (Path(path) / TRAINER_STATE_FILE).unlink(missing_ok=True)


def load_optimizer_state(path: str | Path, optimizer: torch.optim.Optimizer) -> bool:
    """Load the optimizer state saved with checkpoint `path` into `optimizer`; False if none."""
    f = Path(path) / OPTIMIZER_FILE
    if not f.exists():
        return False
    optimizer.load_state_dict(torch.load(f, weights_only=True, map_location="cpu"))
    return True


def load_trainer_state(path: str | Path, scheduler: Any = None) -> bool:
    """Restore the RNG states (and `scheduler`'s state) saved with checkpoint `path`; False if none.

    Call it last, after every model and engine is built: building them draws from torch's
    generator, and the resumed run must continue from the state the saved run had.
    """
    f = Path(path) / TRAINER_STATE_FILE
    if not f.exists():
        return False
    state = torch.load(f, weights_only=True, map_location="cpu")
    set_rng_state(state["rng"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    return True


def rng_state() -> dict[str, Any]:
    """The global RNG states of python, numpy and torch (CPU, and CUDA when present), as plain
    types."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    out: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def seed_rng(seed: int) -> None:
    """Seed the global RNGs of python, numpy and torch (every device) with `seed`."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_rng_state(state: dict[str, Any]) -> None:
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def retained_versions(versions: Iterable[int], keep: int, protected: Iterable[int]) -> set[int]:
    """The versions retention keeps: the newest `keep` (0 or less: all) and every `protected` one.

    >>> sorted(retained_versions(range(10), 2, {0, 1, 4}))
    [0, 1, 4, 8, 9]
    """
    versions = sorted(versions)
    newest = versions if keep <= 0 else versions[-keep:]
    return set(newest) | (set(protected) & set(versions))


def prune_checkpoints(run: RunDir, keep: int, protected: Iterable[int]) -> list[int]:
    """Delete every checkpoint `retained_versions` does not keep; returns the deleted versions.

    Each is renamed away before it is deleted (`remove_dir`), so a kill mid-deletion never
    leaves a half-deleted version that `versions()` would list.
    """
    versions = run.versions()
    kept = retained_versions(versions, keep, protected)
    gone = [v for v in versions if v not in kept]
    for v in gone:
        remove_dir(run.checkpoint(v))
    return gone
