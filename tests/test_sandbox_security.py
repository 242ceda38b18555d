"""Attacks on the sandbox. Each test FAILS IF ITS ATTACK WORKS.

Every attack runs real code under real bubblewrap against real host resources that the
test sets up first (a secret file, a loopback listener, a unix socket, a sleeping host
process, an environment secret), then checks from the host that nothing leaked, changed
or survived. Where an attack needs a limit to bite, the limits are small (see LIMITS).

Without working user namespaces these tests fail (the sandbox fails closed); set
TAURL_SKIP_SANDBOX_TESTS=1 to skip them on such a machine.
"""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
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


def make_box(template: Path | None = None) -> Sandbox:
    """An isolated sandbox, or a test failure: these attacks are real and must never run
    against the host itself (e.g. with unsafe_no_isolation)."""
    try:
        box = Sandbox.create(SandboxConfig(limits=LIMITS), template=template)
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
def host_secret(tmp_path: Path) -> Path:
    p = tmp_path / "secret.txt"
    p.write_text(SECRET)
    p.chmod(0o644)  # readable by anyone on the host: only isolation keeps it out
    return p


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
    path = {"host_secret": str(host_secret), "repo": str(REPO / "pyproject.toml")}.get(
        target, target
    )
    r = py(
        sb,
        f"""
        import os, sys
        p = {path!r}
        try:
            print(os.listdir(p) if os.path.isdir(p) else open(p).read()); sys.exit(0)
        except OSError as e:
            print("denied", e); sys.exit(3)
    """,
    )
    assert r.exit_code == 3, r
    assert not leaked(r)


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


@pytest.mark.parametrize(
    "where",
    ["host_tmp", "/usr/bin", "/", "/etc", "/dev"],
    ids=["host_tmp", "usr", "root_fs", "etc", "dev"],
)
def test_write_outside_workspace(sb, tmp_path, where):
    target = (tmp_path if where == "host_tmp" else Path(where)) / f"evil-{uuid.uuid4().hex}"
    r = sb.run_sync(f"echo pwned > {target}")
    assert r.exit_code != 0, r
    assert not target.exists()


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


def test_fill_disk_one_big_file(sb):
    r = sb.run_sync("dd if=/dev/zero of=big bs=1M count=100")
    assert r.exit_code != 0
    assert (sb.workspace / "big").stat().st_size <= LIMITS.fsize_bytes


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"], ids=["tmp", "dev_shm"])
def test_fill_tmpfs_with_many_files(sb, where):
    # Each file stays under RLIMIT_FSIZE; only the tmpfs size can stop this.
    r = py(
        sb,
        f"""
        n = 0
        try:
            while n < 1000:
                open(f"{where}/f{{n}}", "wb").write(b"x" * (256 << 10)); n += 1
        except OSError as e:
            print(n, e.strerror)
    """,
    )
    size = LIMITS.tmp_bytes if where == "/tmp" else LIMITS.shm_bytes
    assert "No space left" in r.stdout, r
    assert int(r.stdout.split()[0]) * (256 << 10) <= size


def test_memory_bomb(sb):
    r = py(sb, "x = bytearray(2 << 30); print('allocated')")
    assert r.exit_code != 0 and "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_cpu_spin(sb):
    r = py(sb, "while True: pass", timeout_s=10)
    assert r.exit_signal in (9, 24) and not r.timed_out  # SIGXCPU, then SIGKILL at the hard limit
    assert r.wall_s < 6


def test_sleep_past_timeout(sb):
    r = sb.run_sync("sleep 60", timeout_s=0.5)
    assert r.timed_out and r.killed_reason == "timeout" and r.wall_s < 2.5


def test_fork_bomb(sb):
    marker = "forkbomb-" + uuid.uuid4().hex
    # The classic bomb, then (with builtins only: fork fails) wait and count the pids.
    wait = "s=${EPOCHREALTIME/./}; while (( ${EPOCHREALTIME/./} - s < 500000 )); do :; done"
    script = f"b(){{ b | b & }}; b; {wait}; p=(/proc/[0-9]*); echo ${{#p[@]}} # {marker}"
    r = sb.run_sync(["bash", "-c", script], timeout_s=4)
    assert 0 < int(r.stdout) <= LIMITS.nproc and r.wall_s < 4 + 5
    assert host_pids_with(marker) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


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
    assert "daemon started" in r.stdout and r.timed_out == timeout
    assert host_pids_with(marker) == []


# --- network -----------------------------------------------------------------------


def test_tcp_to_host_loopback_listener(sb):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.2)
        port = srv.getsockname()[1]
        r = py(
            sb,
            f"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('connected')",
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


def test_outside_network(sb):
    r = py(sb, "import socket; socket.create_connection(('1.1.1.1', 53), 2); print('connected')")
    assert r.exit_code != 0 and "connected" not in r.stdout


def test_dns(sb):
    r = py(sb, "import socket; print(socket.getaddrinfo('pypi.org', 443))")
    assert r.exit_code != 0 and "gaierror" in r.stderr


def test_only_loopback_interface(sb):
    r = py(sb, "import socket; print([n for _, n in socket.if_nameindex()])")
    assert r.stdout.strip() == "['lo']"


def test_unix_socket_to_host(sb, tmp_path):
    path = tmp_path / "host.sock"
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(str(path))
        srv.listen()
        r = py(
            sb,
            f"import socket; socket.socket(socket.AF_UNIX).connect({str(path)!r}); print('connected')",
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


def test_parent_environment_secret(sb, monkeypatch):
    monkeypatch.setenv("TAURL_TEST_SECRET", SECRET)
    r = sb.run_sync("env; cat /proc/self/environ /proc/1/environ")
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


@pytest.mark.parametrize("how", ["by_pid", "kill_all"])
def test_signal_host_processes(sb, how):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        target = victim.pid if how == "by_pid" else -1
        py(
            sb,
            f"import os, signal\nfor p in ({target}, {os.getpid()}):\n try: os.kill(p, 9)\n except OSError as e: print(e)",
        )
        assert victim.poll() is None  # still running, and so are we
    finally:
        victim.kill()
        victim.wait()


def test_ptrace_host_process(sb):
    r = py(
        sb,
        f"""
        import ctypes, ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        print(libc.ptrace(16, {os.getpid()}, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
        print(open("/proc/{os.getpid()}/mem", "rb").read(1))
    """,
    )
    assert r.stdout.startswith("-1 ") and r.exit_code != 0


def test_setuid_escalation(sb):
    r = py(
        sb,
        """
        import os
        status = open("/proc/self/status").read()
        print([l for l in status.splitlines() if l.startswith(("CapEff", "CapPrm", "CapBnd", "NoNewPrivs"))])
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


def test_hostname_change(sb):
    before = socket.gethostname()
    r = sb.run_sync("hostname pwned; cat /proc/sys/kernel/hostname")
    assert socket.gethostname() == before and r.stdout.strip() == "sandbox"


def test_kernel_tunables_read_only(sb):
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    r = sb.run_sync("echo b > /proc/sysrq-trigger; echo '|/bin/sh' > /proc/sys/kernel/core_pattern")
    assert r.stderr.count("cannot create") == 2, r
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


def test_no_file_descriptors_leak_in(sb):
    r = py(sb, "import os; print(sorted(os.listdir('/proc/self/fd')))")
    assert r.stdout.strip() == "['0', '1', '2', '3']"  # 3: the listing itself


def test_no_controlling_terminal(sb):
    # --new-session: no way back to the caller's terminal (TIOCSTI keystroke injection).
    r = py(sb, "open('/dev/tty', 'wb')")
    assert r.exit_code != 0 and "OSError" in r.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
