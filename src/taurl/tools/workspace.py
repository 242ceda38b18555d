"""Host-side workspace handling: create, reset from a template, and read/write safely.

A workspace is a host directory that a sandbox sees read-write at ``/workspace``. The
code inside the sandbox controls its contents, so the host must treat them as hostile:

* never follow a link the sandbox made: `read_file` / `write_file` open every path
  component with ``O_NOFOLLOW`` relative to the workspace (``openat`` walk), so
  ``/workspace/x -> /etc/shadow`` cannot make the host read or write a host file;
* removal uses `shutil.rmtree`, which on Linux is fd-based and never follows links;
* when the sandbox runs as another host uid (the host process is root), files the host
  puts there are given to that uid so the sandbox can write them.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from taurl.errors import SandboxError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def chown_tree(path: Path, owner: tuple[int, int] | None) -> None:
    """Give `path` and everything under it to (uid, gid), without following links."""
    if owner is None:
        return
    uid, gid = owner
    os.chown(path, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def check_reachable(path: Path, owner: tuple[int, int]) -> None:
    """bwrap opens the workspace as the sandbox uid: every parent needs x for it."""
    for parent in path.parents:
        st = parent.stat()
        if (
            st.st_mode & 0o001
            or (st.st_uid == owner[0] and st.st_mode & 0o100)
            or (st.st_gid == owner[1] and st.st_mode & 0o010)
        ):
            continue
        raise SandboxError(
            f"the sandbox uid {owner[0]} cannot reach workspace {path}: {parent} has mode "
            f"{oct(st.st_mode & 0o777)}. Put workspaces under Sandbox.create()'s default "
            "root, /tmp or another directory with o+x on every parent"
        )


def fill_workspace(path: Path, template: Path | None, owner: tuple[int, int] | None) -> None:
    """Make `path` a fresh copy of `template` (or an empty directory), owned by `owner`.

    Links in the template are copied as links (never followed). The template is trusted:
    it is written by the host, not by a sandbox.
    """
    if template is None:
        path.mkdir(mode=0o700)
    else:
        shutil.copytree(template, path, symlinks=True)
        path.chmod(0o700)
    chown_tree(path, owner)


def clear_workspace(path: Path) -> None:
    """Remove `path` and all it holds, even directories the sandbox made unreadable."""

    def _unlock(func, p, _exc):  # a sandbox may chmod 000 its own directories
        parent = os.path.dirname(p)
        os.chmod(parent, stat.S_IRWXU, follow_symlinks=False)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, stat.S_IRWXU)
            shutil.rmtree(p)
        else:
            func(p)

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=_unlock)


def reset_workspace(path: Path, template: Path | None, owner: tuple[int, int] | None) -> None:
    """Bring `path` back to the template's state: remove everything, copy it again.

    rm + copytree beats diffing for the small templates of code tasks (see
    benchmarks/sandbox.py for the measured cost).
    """
    clear_workspace(path)
    fill_workspace(path, template, owner)


def tree_bytes(path: Path) -> int:
    """Total size of the regular files under `path` (links not followed)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _split(rel: str) -> list[str]:
    parts = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
    if rel.startswith("/") or not parts or ".." in parts:
        raise SandboxError(
            f"workspace path {rel!r} must be relative to the workspace, non-empty and "
            "without '..' (e.g. 'src/main.py')"
        )
    return parts


def _open_parent(root: Path, parts: list[str], create: bool, owner) -> int:
    """Open the directory holding parts[-1], refusing any link on the way."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in parts[:-1]:
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as e:
        os.close(fd)
        raise SandboxError(
            f"cannot open {'/'.join(parts)!r} in the workspace: {e.strerror} "
            "(a link or a non-directory on the way is refused)"
        ) from None
    return fd


def read_file(root: Path, rel: str, max_bytes: int = 1 << 20) -> bytes:
    """Read at most `max_bytes` of the regular file `rel` under the workspace `root`."""
    parts = _split(rel)
    dfd = _open_parent(root, parts, create=False, owner=None)
    try:
        fd = os.open(
            parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd
        )
    except OSError as e:
        raise SandboxError(f"cannot read {rel!r} in the workspace: {e.strerror}") from None
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise SandboxError(f"{rel!r} in the workspace is not a regular file")
        return f.read(max_bytes)


def write_file(root: Path, rel: str, data: bytes | str, owner: tuple[int, int] | None) -> None:
    """Create or replace the file `rel` under `root`, creating parent directories."""
    parts = _split(rel)
    payload = data.encode() if isinstance(data, str) else data
    dfd = _open_parent(root, parts, create=True, owner=owner)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(parts[-1], flags | os.O_NONBLOCK, 0o644, dir_fd=dfd)
    except OSError as e:
        raise SandboxError(f"cannot write {rel!r} in the workspace: {e.strerror}") from None
    finally:
        os.close(dfd)
    with os.fdopen(fd, "wb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise SandboxError(f"{rel!r} in the workspace is not a regular file")
        f.write(payload)
        if owner is not None:
            os.fchown(f.fileno(), *owner)
