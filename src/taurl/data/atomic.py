"""Writes a crash never leaves half-done: a file or a directory is there whole, or not at all.

The POSIX recipe (the one SQLite and git follow): write into a temporary sibling, fsync
every file and the temporary directory, ``rename`` it into place (atomic within one file
system), then fsync the parent so the rename itself survives a power loss. A process
killed at any point leaves either the old object or the new one, plus a dot-named
leftover that `clean_leftovers` removes at the next start.

A full disk (ENOSPC) or any other OSError while writing raises `DiskWriteError`, which
says what was being written, why, and that nothing half-written was kept.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from taurl.errors import Error


class DiskWriteError(Error, OSError):
    """A file or checkpoint could not be written; nothing half-written was left in place."""


def write_error(what: str | Path, e: Exception) -> DiskWriteError:
    """The user-facing error for an OSError (or a writer's own I/O error, e.g. safetensors') while
    writing `what`."""
    full = getattr(e, "errno", None) in (errno.ENOSPC,
                                         errno.EDQUOT) or "No space left on device" in str(e)
    why = "the disk is full" if full else (getattr(e, "strerror", None) or str(e))
    return DiskWriteError(f"cannot write {what}: {why} ({type(e).__name__}: {e}); nothing "
                          "half-written was kept. Free space (or choose another --run-dir) and run "
                          "the same command again: the run resumes from its last complete "
                          "checkpoint")


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory (a directory's fsync makes its entries durable)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if Path(path).is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every file under `root`, then every directory, deepest first."""
    dirs = []
    for here, _, files in os.walk(root):
        dirs.append(here)
        for f in files:
            fsync_path(Path(here) / f)
    for d in reversed(dirs):
        fsync_path(d)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Replace `path` with `text` atomically: a reader sees the old content or the new, whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise write_error(path, e) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def replace_dir(new: Path, final: Path) -> None:
    """Move the complete, fsynced directory `new` to `final` (replacing it), durably.

    A directory cannot be renamed over a non-empty one, so an existing `final` is first
    renamed aside to ``.<name>.old`` and deleted after; if the process dies between the two
    renames, `clean_leftovers` puts the old one back.
    """
    old = final.with_name(f".{final.name}.old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    new.rename(final)
    fsync_path(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def remove_dir(path: Path) -> None:
    """Delete directory `path` so that no crash leaves it half-deleted under its own name."""
    if not path.exists():
        return
    doomed = path.with_name(f".{path.name}.deleting")
    shutil.rmtree(doomed, ignore_errors=True)
    path.rename(doomed)  # atomic: from here on nothing looks at it
    fsync_path(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def clean_leftovers(parent: Path) -> list[str]:
    """Remove what interrupted writes left in `parent` (dot-named temporaries); returns their names.

    ``.<name>.old`` whose ``<name>`` is missing is the only complete copy (the process died
    between `replace_dir`'s two renames): it is renamed back instead.
    """
    if not parent.is_dir():
        return []
    removed = []
    for p in sorted(parent.iterdir()):
        if not p.name.startswith("."):
            continue
        if p.name.endswith(".old") and p.is_dir() and not (orig := parent / p.name[1:-4]).exists():
            p.rename(orig)
            continue
        if (".tmp-" in p.name or p.name.endswith((".old", ".deleting", ".partial"))
            or ".old-" in p.name):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            removed.append(p.name)
    if removed:
        fsync_path(parent)
    return removed
