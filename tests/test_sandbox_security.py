"""Attacks on the sandbox. Each test FAILS IF ITS ATTACK WORKS.

Every attack runs real code under real bubblewrap against real host resources that the
test sets up first (a secret file, a loopback listener, a unix socket, a sleeping host
process, an environment secret), then checks from the host that nothing leaked, changed
or survived. Where an attack needs a limit to bite, the limits are small (see LIMITS).

Each attack must fail without isolation for ANY user, root or not: its target is
something the test itself makes readable or writable on the host (a 0644 file and a 0777
directory under /tmp, outside the sandbox's mounts; a listener on the host's loopback or
its own address; a process running as the sandbox's uid), or the test asserts what only
the sandbox gives (ENOENT for a host path that is not mounted, EROFS for a read-only
mount, ESRCH for a host pid) rather than an error a non-root user gets anyway.
`tests/mutation_check.py` runs this file with isolation switched off and requires every
test to fail, except those marked ``mutation_exempt`` (each says why).

Without working user namespaces these tests fail (the sandbox fails closed); set
TAURL_SKIP_SANDBOX_TESTS=1 to skip them on such a machine.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from taurl.errors import SandboxError
from taurl.tools import ExecResult, Sandbox, SandboxConfig, SandboxLimits

REPO = Path(__file__).resolve().parents[1]
LIMITS = SandboxLimits(
    timeout_s=5.0,
    cpu_s=1,
    memory_bytes=512 << 20,
    nproc=32,
    fsize_bytes=1 << 20,
    nofile=64,
    tmp_bytes=4 << 20,
    shm_bytes=1 << 20,
    max_output_bytes=4096,
    max_drain_bytes=1 << 20,
)
SECRET = "taurl-secret-" + uuid.uuid4().hex
SANDBOX_HOST_UID = 65534  # the host uid the sandbox runs as when the tests run as root
pytestmark = pytest.mark.attack
NOT_ISOLATION = "no-isolation"


def exempt(reason: str):
    """Not required to fail without isolation (tests/mutation_check.py); skipped there."""
    return pytest.mark.mutation_exempt(NOT_ISOLATION, reason)


def limit(test):
    """A resource limit (rlimit or tmpfs size): must fail when the limits are lifted, and is
    not required to fail without isolation (which keeps the rlimits)."""
    return exempt("a resource limit, kept when isolation is off")(pytest.mark.limits(test))


HOST_CAP = exempt("the host's timeout or output cap, kept when isolation is off")
HARMFUL = exempt(
    "would harm the shared host if the attack worked there; a sibling test covers the property"
)


def make_box(template: Path | None = None, config: SandboxConfig | None = None) -> Sandbox:
    """An isolated sandbox, or a test failure: these attacks are real and must never run
    against the host itself (e.g. with unsafe_no_isolation)."""
    try:
        box = Sandbox.create(config or SandboxConfig(limits=LIMITS), template=template)
    except SandboxError as e:
        if os.environ.get("TAURL_SKIP_SANDBOX_TESTS") == "1":
            pytest.skip(f"sandbox isolation unavailable: {e}")
        raise
    if not box.isolated:
        box.close()
        pytest.fail("refusing to run the attack suite without isolation")
    return box


@pytest.fixture
def sb():
    box = make_box()
    yield box
    box.close()


@pytest.fixture
def host_dir():
    """A 0777 directory under /tmp: any uid (the sandbox's host uid too) may write in it,
    so only isolation keeps the sandbox out."""
    d = Path(
        tempfile.mkdtemp(prefix="taurl-attack-", dir="/tmp" if os.path.isdir("/tmp") else None)
    )
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def host_secret(host_dir: Path) -> Path:
    p = host_dir / "secret.txt"
    p.write_text(SECRET)
    p.chmod(0o644)  # readable by anyone on the host: only isolation keeps it out
    return p


@pytest.fixture
def host_victim():
    """A host process running as the uid the sandbox's code runs as on the host (this
    process's, or the sandbox uid when we are root): only the pid namespace protects it."""
    user = SANDBOX_HOST_UID if os.geteuid() == 0 else None
    p = subprocess.Popen(
        ["sleep", "30"], user=user, group=user,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TAURL_TEST_SECRET": SECRET},
    )
    yield p
    p.kill()
    p.wait()


def py(sb: Sandbox, code: str, **kw) -> ExecResult:
    return sb.run_sync(["python3", "-c", textwrap.dedent(code)], **kw)


def leaked(r: ExecResult) -> bool:
    return SECRET in r.stdout or SECRET in r.stderr


def host_pids_with(marker: str) -> list[int]:
    """Host processes whose command line contains `marker` (a /proc scan)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass  # exited meanwhile
    return pids


# --- filesystem: reading the host --------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "host_secret",
        "host_dir",
        "/etc/shadow",
        "/root",
        "/home",
        "/work",
        "repo",
        "/proc/1/root/etc/shadow",
        "/sys",
    ],
    ids=[
        "host_tmp_secret",
        "host_tmp_dir",
        "etc_shadow",
        "root_home",
        "home",
        "work_dir",
        "repo",
        "proc_root",
        "sys",
    ],
)
def test_read_host_paths(sb, host_secret, target):
    # Not "denied" but absent: a non-root user is denied /etc/shadow or /root without any
    # sandbox; only the sandbox's own root makes them not exist at all.
    path = {"host_secret": str(host_secret), "host_dir": str(host_secret.parent),
            "repo": str(REPO / "pyproject.toml")}.get(target, target)  # fmt: skip
    r = py(
        sb,
        f"""
        import errno, os, sys
        p = {path!r}
        try:
            print(os.listdir(p) if os.path.isdir(p) else open(p).read()); sys.exit(0)
        except OSError as e:
            print("denied", errno.errorcode[e.errno]); sys.exit(3)
    """,
    )
    assert r.exit_code == 3 and r.stdout.startswith("denied ENOENT"), r
    assert not leaked(r) and "secret.txt" not in r.stdout


def test_etc_holds_only_the_allowed_subset(sb):
    r = py(sb, "import os; print(sorted(os.listdir('/etc')))")
    names = set(ast.literal_eval(r.stdout))
    assert not names & {"shadow", "gshadow", "sudoers", "ssh", "pip.conf", "gitconfig", "npmrc"}
    assert "passwd" in names and len(names) < 20, names


def test_symlink_out_of_workspace(sb, host_secret):
    r = sb.run_sync(f"ln -s {host_secret} link && cat link")
    assert r.exit_code != 0 and not leaked(r)


def test_template_symlink_does_not_reach_host(tmp_path, host_secret):
    # A symlink planted by the host side (e.g. a task template) resolves inside the sandbox.
    tmpl = tmp_path / "tmpl"
    tmpl.mkdir()
    (tmpl / "link").symlink_to(host_secret)
    with make_box(tmpl) as box:
        r = box.run_sync("cat link")
    assert r.exit_code != 0 and not leaked(r)


@exempt("host-side: the host's reader refuses links with or without isolation")
def test_host_reader_refuses_sandbox_symlink(sb, host_secret):
    # The sandbox plants a link; the host's read_file/write_file must not follow it.
    assert sb.run_sync(f"ln -s {host_secret} out && ln -s /etc d").ok
    with pytest.raises(SandboxError):
        sb.read_file("out")
    with pytest.raises(SandboxError):
        sb.write_file("d/evil", "x")
    assert host_secret.read_text() == SECRET and not Path("/etc/evil").exists()


def test_other_sandbox_workspace_invisible(sb):
    with make_box() as other:
        other.write_file("note.txt", SECRET)
        r = sb.run_sync(f"cat {other.workspace}/note.txt; ls {other.workspace.parent}")
    assert r.exit_code != 0 and not leaked(r)


# --- filesystem: writing outside the workspace -------------------------------------


def test_write_to_host_dir(sb, host_dir):
    target = host_dir / f"evil-{uuid.uuid4().hex}"
    r = sb.run_sync(f"echo pwned > {target}")
    assert r.exit_code != 0, r
    assert not target.exists()


@pytest.mark.parametrize(
    "where",
    ["ro_bind", "/usr/bin", "/", "/etc", "/dev"],
    ids=["ro_bind", "usr", "root_fs", "etc", "dev"],
)
def test_write_read_only_mounts(host_dir, where):
    # EROFS, the mount's answer: without a sandbox root writes there and others get EACCES.
    # ro_bind: a 0777 host directory bound read-only, so permissions never stand in the way.
    cfg = SandboxConfig(limits=LIMITS, ro_binds=((str(host_dir), "/opt/taurl-ro"),))
    target = Path("/opt/taurl-ro" if where == "ro_bind" else where) / f"evil-{uuid.uuid4().hex}"
    try:
        with make_box(config=cfg) as box:
            r = box.run_sync(f"echo pwned > {target}")
        assert r.exit_code != 0 and "Read-only file system" in r.stderr, r
        assert not target.exists() and os.listdir(host_dir) == []
    finally:
        with contextlib.suppress(OSError):
            target.unlink()  # only where the attack worked (isolation switched off)


def test_mount_table_is_the_sandbox_s(sb):
    r = sb.run_sync("cat /proc/self/mountinfo")
    assert " /usr ro," in r.stdout and " /workspace rw," in r.stdout and " /tmp rw," in r.stdout, (
        r.stdout
    )


@HARMFUL
def test_mount_attempts(sb):
    r = sb.run_sync("mount -t tmpfs none /tmp; mount --bind /workspace /usr; umount /workspace; "
                    "umount -l /usr; cat /proc/self/mountinfo")  # fmt: skip
    assert "mount:" in r.stderr or "umount:" in r.stderr  # each one refused
    assert " /usr ro," in r.stdout and " /workspace rw," in r.stdout


def test_nested_user_namespace(sb):
    # A new user namespace would hand the code all capabilities inside it.
    r = sb.run_sync("unshare --user --map-root-user id -u")
    assert r.exit_code != 0 and r.stdout.strip() != "0", r


# --- limits: disk, memory, cpu, processes, time, output -----------------------------


@limit
def test_fill_disk_one_big_file(sb):
    r = sb.run_sync("dd if=/dev/zero of=big bs=1M count=100")
    assert r.exit_code != 0
    assert (sb.workspace / "big").stat().st_size <= LIMITS.fsize_bytes


@pytest.mark.limits
@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"], ids=["tmp", "dev_shm"])
def test_fill_tmpfs_with_many_files(sb, where):
    # Each file stays under RLIMIT_FSIZE; only the tmpfs size can stop this. The files go
    # in a fresh directory, removed from the host's side too in case the attack ran there.
    d = Path(where, f"taurl-fill-{uuid.uuid4().hex}")
    try:
        r = py(
            sb,
            f"""
            import os
            n = 0
            os.mkdir("{d}")
            try:
                while n < 1000:
                    open(f"{d}/f{{n}}", "wb").write(b"x" * (256 << 10)); n += 1
            except OSError as e:
                print(n, e.strerror)
        """,
        )
    finally:
        shutil.rmtree(d, ignore_errors=True)
    size = LIMITS.tmp_bytes if where == "/tmp" else LIMITS.shm_bytes
    assert "No space left" in r.stdout, r
    assert int(r.stdout.split()[0]) * (256 << 10) <= size


@limit
def test_memory_bomb(sb):
    r = py(sb, "x = bytearray(2 << 30); print('allocated')")
    assert r.exit_code != 0 and "MemoryError" in r.stderr and "allocated" not in r.stdout


@limit
def test_cpu_spin(sb):
    r = py(sb, "while True: pass", timeout_s=10)
    assert r.exit_signal in (9, 24) and not r.timed_out  # SIGXCPU, then SIGKILL at the hard limit
    assert r.wall_s < 6


@HOST_CAP
def test_sleep_past_timeout(sb):
    r = sb.run_sync("sleep 60", timeout_s=0.5)
    assert r.timed_out and r.killed_reason == "timeout" and r.wall_s < 2.5


@pytest.mark.limits
@exempt(
    "a fork bomb on the host: root has no RLIMIT_NPROC; "
    "test_orphans_do_not_survive covers the pid namespace"
)
@pytest.mark.mutation_exempt("no-limits", "an unbounded fork bomb would exhaust the shared host; "
                             "test_fork_count_bounded covers RLIMIT_NPROC")
def test_fork_bomb(sb):
    marker = "forkbomb-" + uuid.uuid4().hex
    # The classic bomb, then (with builtins only: fork fails) wait and count the pids.
    wait = "s=${EPOCHREALTIME/./}; while (( ${EPOCHREALTIME/./} - s < 500000 )); do :; done"
    script = f"b(){{ b | b & }}; b; {wait}; p=(/proc/[0-9]*); echo ${{#p[@]}} # {marker}"
    r = sb.run_sync(["bash", "-c", script], timeout_s=4)
    assert 0 < int(r.stdout) <= LIMITS.nproc and r.wall_s < 4 + 5
    assert host_pids_with(marker) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


@limit
def test_fork_count_bounded(sb):
    r = py(
        sb,
        """
        import os, time
        n = 0
        try:
            while n < 500:
                if os.fork() == 0:
                    time.sleep(5); os._exit(0)
                n += 1
        except OSError:
            pass
        print(n)
        os._exit(0)
    """,
    )
    assert int(r.stdout) < LIMITS.nproc, r


@limit
def test_open_files_bounded(sb):
    r = py(
        sb,
        """
        fs = []
        try:
            while len(fs) < 10000: fs.append(open("/dev/null"))
        except OSError:
            pass
        print(len(fs))
    """,
    )
    assert int(r.stdout) < LIMITS.nofile


@HOST_CAP
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_flood_output(sb, stream):
    r = sb.run_sync("yes" if stream == "stdout" else "yes >&2", timeout_s=5)
    assert r.killed_reason == "output_limit" and r.wall_s < 5
    assert len(getattr(r, stream).encode()) <= LIMITS.max_output_bytes
    assert getattr(r, f"truncated_{stream}")


@pytest.mark.parametrize("timeout", [False, True], ids=["after_exit", "after_timeout"])
def test_orphans_do_not_survive(sb, timeout):
    marker = "orphan-" + uuid.uuid4().hex
    r = py(sb, f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["{marker}", "30"])  # a daemon, reparented to init
            os._exit(0)
        for _ in range(100):  # wait until it runs, seen from inside
            time.sleep(0.01)
            if any(b"{marker}" in open(f"/proc/{{p}}/cmdline", "rb").read()
                   for p in os.listdir("/proc") if p.isdigit()):
                print("daemon started")
                break
        {"time.sleep(30)" if timeout else ""}
    """, timeout_s=1.0)  # fmt: skip
    survivors = host_pids_with(marker)
    for pid in survivors:  # only where the attack worked (isolation switched off)
        os.kill(pid, 9)
    assert "daemon started" in r.stdout and r.timed_out == timeout
    assert survivors == []


# --- network -----------------------------------------------------------------------


def test_tcp_to_host_loopback_listener(sb):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.2)
        port = srv.getsockname()[1]
        r = py(
            sb,
            f"import socket; socket.create_connection(('127.0.0.1', {port}), 2); "
            "print('connected')",
        )
        with pytest.raises(TimeoutError):
            srv.accept()
    assert r.exit_code != 0 and "connected" not in r.stdout


def test_udp_to_host_loopback(sb):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.settimeout(0.2)
        port = srv.getsockname()[1]
        py(sb, f"import socket; socket.socket(2, 2).sendto(b'{SECRET}', ('127.0.0.1', {port}))")
        with pytest.raises(TimeoutError):
            srv.recvfrom(100)


def host_addresses() -> list[str]:
    """The host's IPv4 addresses other than loopback (SIOCGIFADDR on each interface)."""
    found = []
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
        addr = socket.inet_ntoa(packed[20:24])
        if not addr.startswith("127."):
            found.append(addr)
    return found


def test_outside_network(sb):
    # The host's own non-loopback address stands for "outside": a listener the test starts
    # there answers any process on the host, online or offline, but never the sandbox.
    addrs = host_addresses()
    if not addrs:
        pytest.skip("the host has no non-loopback IPv4 address to listen on")
    with socket.socket() as srv:
        srv.bind((addrs[0], 0))
        srv.listen()
        srv.settimeout(0.2)
        port = srv.getsockname()[1]
        r = py(
            sb,
            f"import socket; socket.create_connection(({addrs[0]!r}, {port}), 2); "
            "print('connected')",
        )
        with pytest.raises(TimeoutError):
            srv.accept()
    assert r.exit_code != 0 and "connected" not in r.stdout


def test_dns(sb):
    # No resolver configuration at all (the host has one), and the host's own name, which
    # its /etc/hosts or DNS resolves, does not resolve inside.
    host = socket.gethostname()
    try:
        socket.getaddrinfo(host, 443)
        if host == "sandbox":
            raise OSError("the sandbox's own name")
    except OSError:
        host = "localhost.invalid"  # not resolvable on the host either: the first check decides
    r = py(sb, f"""
        import socket
        print("resolv.conf" if __import__("os").path.exists("/etc/resolv.conf")
              else "no resolv.conf")
        print(socket.getaddrinfo({host!r}, 443))
    """)  # fmt: skip
    assert r.stdout.startswith("no resolv.conf") and r.exit_code != 0 and "gaierror" in r.stderr, r


def test_only_loopback_interface(sb):
    r = py(
        sb,
        "import os, socket; print([n for _, n in socket.if_nameindex()], "
        "os.readlink('/proc/self/ns/net'))",
    )
    names, netns = r.stdout.rsplit(" ", 1)
    assert names == "['lo']" and netns.strip() != os.readlink("/proc/self/ns/net")


def test_unix_socket_to_host(sb, host_dir):
    path = host_dir / "host.sock"
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(str(path))
        path.chmod(0o777)  # any uid may connect: only isolation keeps the sandbox out
        srv.listen()
        r = py(
            sb,
            f"import socket; socket.socket(socket.AF_UNIX).connect({str(path)!r}); "
            "print('connected')",
        )
    assert r.exit_code != 0 and "connected" not in r.stdout


def test_abstract_unix_socket_to_host(sb):
    # Abstract sockets have no path: only the network namespace separates them.
    name = "\0taurl-test-" + uuid.uuid4().hex
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(name)
        srv.listen()
        r = py(
            sb,
            f"import socket; socket.socket(socket.AF_UNIX).connect({name!r}); print('connected')",
        )
    assert r.exit_code != 0 and "connected" not in r.stdout


# --- processes, environment, identity ----------------------------------------------


def test_parent_environment_secret(sb, monkeypatch, host_victim):
    # In our environment, and in that of a host process of the sandbox's own host uid.
    monkeypatch.setenv("TAURL_TEST_SECRET", SECRET)
    r = sb.run_sync(f"env; cat /proc/self/environ /proc/1/environ /proc/{host_victim.pid}/environ")
    assert not leaked(r) and "TAURL_TEST_SECRET" not in r.stdout
    assert "HOME=/workspace" in r.stdout


def test_host_processes_invisible(sb):
    r = py(
        sb,
        """
        import os
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        print(max(pids), [open(f"/proc/{p}/cmdline", "rb").read()[:40] for p in pids])
    """,
    )
    top, cmdlines = r.stdout.split(" ", 1)
    assert int(top) < 10 and "pytest" not in cmdlines, r.stdout


def test_signal_host_process(sb, host_victim):
    r = py(
        sb, f"import os\ntry: os.kill({host_victim.pid}, 9)\nexcept OSError as e: print(e.errno)"
    )
    assert host_victim.poll() is None and r.stdout.strip() == "3"  # ESRCH: no such pid in here


@exempt(
    "kill(-1) on the host kills every process the uid may signal; "
    "test_signal_host_process covers it"
)
def test_signal_all_host_processes(sb, host_victim):
    py(
        sb,
        f"import os\nfor p in (-1, {os.getpid()}):\n try: os.kill(p, 9)\n"
        " except OSError as e: print(e)",
    )
    assert host_victim.poll() is None  # still running, and so are we


def test_ptrace_host_process(sb, host_victim):
    # ESRCH, not EPERM: Yama refuses a non-root ptrace anyway; only the pid namespace hides it.
    r = py(
        sb,
        f"""
        import ctypes, ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        print(libc.ptrace(16, {host_victim.pid}, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
        print(open("/proc/{host_victim.pid}/mem", "rb").read(1))
    """,
    )
    assert r.stdout.startswith("-1 3\n") and "FileNotFoundError" in r.stderr, r


def test_setuid_escalation(sb):
    r = py(
        sb,
        """
        import os
        status = open("/proc/self/status").read()
        print([l for l in status.splitlines()
               if l.startswith(("CapEff", "CapPrm", "CapBnd", "NoNewPrivs"))])
        try:
            os.setuid(0); print("became root")
        except OSError:  # EINVAL: uid 0 is not even mapped in the user namespace
            print("setuid refused")
    """,
    )
    assert "setuid refused" in r.stdout and "became root" not in r.stdout
    for cap in ("CapEff", "CapPrm", "CapBnd"):
        assert f"'{cap}:\\t0000000000000000'" in r.stdout
    assert "'NoNewPrivs:\\t1'" in r.stdout


def test_hostname_is_the_sandbox_s(sb):
    r = sb.run_sync("cat /proc/sys/kernel/hostname")
    assert r.stdout.strip() == "sandbox" != socket.gethostname()


@HARMFUL
def test_hostname_change(sb):
    before = socket.gethostname()
    r = sb.run_sync("hostname pwned; cat /proc/sys/kernel/hostname")
    assert socket.gethostname() == before and r.stdout.strip() == "sandbox"


def test_kernel_tunables_owned_by_no_one_inside(sb):
    # The host's root is not mapped in the sandbox's user namespace: its files there belong
    # to the overflow uid, so even a sandbox "root" could not write them. The write puts
    # back the current value, harmless wherever it succeeds.
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    r = sb.run_sync(
        f"stat -c %u /proc/sys/kernel/core_pattern; echo '{before.strip()}' > "
        "/proc/sys/kernel/core_pattern"
    )
    assert r.stdout.strip() == "65534" and "cannot create" in r.stderr, r
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


@HARMFUL
def test_kernel_tunables_read_only(sb):
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    r = sb.run_sync("echo b > /proc/sysrq-trigger; echo '|/bin/sh' > /proc/sys/kernel/core_pattern")
    assert r.stderr.count("cannot create") == 2, r
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


@exempt("host-side: the spawn closes every fd (close_fds) with or without isolation")
def test_no_file_descriptors_leak_in(sb):
    r = py(sb, "import os; print(sorted(os.listdir('/proc/self/fd')))")
    assert r.stdout.strip() == "['0', '1', '2', '3']"  # 3: the listing itself


@exempt("host-side: the spawn starts a new session with or without isolation")
def test_no_controlling_terminal(sb):
    # --new-session: no way back to the caller's terminal (TIOCSTI keystroke injection).
    r = py(sb, "open('/dev/tty', 'wb')")
    assert r.exit_code != 0 and "OSError" in r.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
