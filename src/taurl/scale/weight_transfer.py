"""Policy weights from the learner to engines on other nodes, through Ray's object store.

An engine that reloads from disk (vLLM's ``reload_weights``) needs the checkpoint on its
own node. Rather than a filesystem shared by every node, the learner packs the files a
server needs (`serving_files`: the safetensors shards, the config and the tokenizer; no
optimizer or trainer state) into one `WeightBundle`, puts it into the object store once
(``ray.put``), and every engine actor writes it into a directory of its own node
(`write_bundle`) and reloads from there, the same reload call as with a shared directory.
Ray moves the object to each node once; nothing here imports Ray.

A bundle is bytes as the learner wrote them, so the engine serves exactly the checkpoint
the learner saved (no re-serialisation); its digest (sha256 over names and bytes) is
checked on the engine's side before a reload.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

# what a server needs of a checkpoint: weights, configs, tokenizer and chat template
SERVED_SUFFIXES = (".safetensors", ".json", ".jinja", ".txt", ".model")
NOT_SERVED = ("prm.safetensors",)  # a step scorer's weights beside the policy's


@dataclass(frozen=True)
class WeightBundle:
    """The serving files of policy `version` (file name -> bytes) and their digest."""

    version: int
    files: dict[str, bytes] = field(repr=False)
    digest: str

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.files.values())


def serving_files(checkpoint_dir: str | Path) -> list[Path]:
    """The top-level files of `checkpoint_dir` a server loads, sorted by name."""
    root = Path(checkpoint_dir)
    out = sorted(
        p
        for p in root.iterdir()
        if p.is_file() and p.suffix in SERVED_SUFFIXES and p.name not in NOT_SERVED
    )
    if not any(p.suffix == ".safetensors" for p in out):
        raise FileNotFoundError(f"no *.safetensors weights in {str(root)!r}")
    return out


def bundle_digest(files: dict[str, bytes]) -> str:
    """sha256 over each file's name, length and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name]
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def pack_checkpoint(checkpoint_dir: str | Path, version: int) -> WeightBundle:
    """The serving files of `checkpoint_dir`, read into memory as policy `version`."""
    files = {p.name: p.read_bytes() for p in serving_files(checkpoint_dir)}
    return WeightBundle(version, files, bundle_digest(files))


def write_bundle(bundle: WeightBundle, root: str | Path, *, keep: int = 1) -> Path:
    """Write `bundle` as ``root/v<version>`` (whole or not at all: a temporary directory
    renamed) after checking its digest; then keep only the newest `keep` versions there.
    Returns the directory, an HF checkpoint a server can load."""
    if bundle_digest(bundle.files) != bundle.digest:
        raise ValueError(f"weight bundle v{bundle.version} does not match its digest (corrupted)")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"v{bundle.version}"
    tmp = root / f".v{bundle.version}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, data in bundle.files.items():
        if Path(name).name != name:  # a bundle names files of one directory, nothing else
            raise ValueError(f"weight bundle file name {name!r} is not a plain file name")
        (tmp / name).write_bytes(data)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    versions = sorted(
        (p for p in root.glob("v*") if p.is_dir() and p.name[1:].isdigit()),
        key=lambda p: int(p.name[1:]),
    )
    for old in versions[:-keep] if keep > 0 else []:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


__all__ = ["WeightBundle", "bundle_digest", "pack_checkpoint", "serving_files", "write_bundle"]
