"""The warm Python executor (`taurl.tools.zygote`): behaviour, then attacks through it.

Every attack runs real code in a zygote under real bubblewrap (never without isolation:
`WarmPython` refuses `unsafe_no_isolation`, and `start` fails the test if isolation is
missing) against host resources the test sets up first, and each test FAILS IF ITS
ATTACK WORKS. Set TAURL_SKIP_SANDBOX_TESTS=1 to skip on a machine without user namespaces.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import textwrap
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from taurl.errors import SandboxError
from taurl.tools import ExecResult, SandboxConfig, SandboxPool
from taurl.tools.zygote import LOST, WarmPython, acquire_warm
from test_sandbox_security import (  # the attack targets, shared
    LIMITS,
    SECRET,
    host_pids_with,
    leaked,
)

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
CFG = SandboxConfig(limits=LIMITS)


def with_wp(fn: Callable[[WarmPython], Awaitable[T]], config: SandboxConfig = CFG) -> T:
    """Run `fn` against a fresh, isolated WarmPython (a new sandbox + zygote)."""

    async def main() -> T:
        async with WarmPython.start(config=config) as wp:
            assert wp.sandbox.isolated  # WarmPython refuses otherwise; never attack the host
            return await fn(wp)

    try:
        return asyncio.run(main())
    except SandboxError as e:
        if os.environ.get("TAURL_SKIP_SANDBOX_TESTS") == "1":
            pytest.skip(f"sandbox isolation unavailable: {e}")
        raise


def code(src: str, **kw) -> ExecResult:
    """One request in a fresh zygote."""
    return with_wp(lambda wp: wp.run_code(textwrap.dedent(src), **kw))


# --- behaviour ---------------------------------------------------------------------


def test_code_behaves_like_python_dash_c():
    async def go(wp: WarmPython) -> list[ExecResult]:
        return [
            await wp.run_code("import os, sys; "
                              "print(6 * 7, os.getcwd(), sys.argv, sys.path[0] == '')"),
            await wp.run_code("import sys; print('bye', file=sys.stderr); sys.exit(3)"),
            await wp.run_code("def f():\n    raise ValueError('boom')\nf()"),
            await wp.run_code("import sys; sys.exit('custom message')"),
            await wp.run_code("print(input()[::-1])", stdin="olleh\n"),
            await wp.run_code("import os; print(os.environ['EXTRA'], os.environ['HOME'])",
                              env={"EXTRA": "x"}),
        ]  # fmt: skip

    ok, exit3, exc, msg, stdin, env = with_wp(go)
    assert ok.ok and ok.stdout == "42 /workspace ['-c'] True\n" and ok.isolated
    assert exit3.exit_code == 3 and exit3.stderr == "bye\n"
    assert exc.exit_code == 1 and exc.stderr.startswith("Traceback (most recent call last):")
    assert 'File "<string>", line 2, in f' in exc.stderr and "zygote" not in exc.stderr
    assert msg.exit_code == 1 and msg.stderr == "custom message\n"
    assert stdin.stdout == "hello\n" and env.stdout == "x /workspace\n"


def test_argv_execs_and_reports_status():
    async def go(wp: WarmPython) -> list[ExecResult]:
        return [
            await wp.run_argv(["sh", "-c", "echo out; echo err >&2; exit 7"]),
            await wp.run_argv(["no-such-program-xyz"]),
            await wp.run_argv(["sh", "-c", "kill -TERM $$"]),
            await wp.run_argv(["cat"], stdin=b"x" * 300_000, max_output_bytes=1 << 20),
        ]

    sh, missing, killed, cat = with_wp(go)
    assert (sh.exit_code, sh.stdout, sh.stderr) == (7, "out\n", "err\n")
    assert missing.exit_code == 127 and "No such file" in missing.stderr
    assert killed.exit_code == 128 + signal.SIGTERM and killed.exit_signal == signal.SIGTERM
    assert cat.ok and cat.stdout_bytes == 300_000 and cat.stdout == "x" * 300_000


def test_no_state_leaks_between_requests_but_workspace_files_persist():
    async def go(wp: WarmPython) -> list[ExecResult]:
        first = await wp.run_code(
            "import builtins, json, os, sys\n"
            "builtins.LEAK = 1; json.dumps = None; sys.path.append('/evil'); "
            "os.environ['E'] = '1'\n"
            "open('/workspace/kept.txt', 'w').write('kept'); open('/tmp/scratch', 'w').write('t')\n"
            "import os; os.makedirs('/tmp/d/e'); os.chmod('/tmp/d', 0)\n"
            "open('/dev/shm/s', 'w').write('s')"
        )
        second = await wp.run_code(
            "import builtins, json, os, sys\n"
            "print(hasattr(builtins, 'LEAK'), json.dumps([1]), "
            "'/evil' in sys.path, 'E' in os.environ)\n"
            "print(open('kept.txt').read(), os.listdir('/tmp'), os.listdir('/dev/shm'))"
        )  # fmt: skip
        return [first, second]

    first, second = with_wp(go)
    assert first.ok, first
    assert second.stdout == "False [1] False False\nkept [] []\n", second


def test_output_caps():
    r = code("import sys; sys.stdout.write('a' * 10000); sys.stderr.write('é' * 3000)")
    assert r.ok and r.stdout == "a" * LIMITS.max_output_bytes and r.truncated_stdout
    assert r.stdout_bytes == 10000 and r.stderr_bytes == 6000 and r.truncated_stderr
    small = code("print('0123456789')", max_output_bytes=4)
    assert small.stdout == "0123" and small.stdout_bytes == 11


def test_requests_on_one_zygote_are_serialized():
    async def go(wp: WarmPython) -> list[ExecResult]:
        src = (
            "import time; open('log', 'a').write('{i}'); time.sleep(0.05); "
            "print(open('log').read())"
        )
        return await asyncio.gather(*(wp.run_code(src.format(i=i)) for i in range(4)))

    rs = with_wp(go)
    # Each request saw the log end with its own digit: no two ran at once.
    assert all(r.ok and r.stdout.strip()[-1] == str(i) for i, r in enumerate(rs)), rs


def test_cancelled_request_restarts_the_zygote():
    async def go(wp: WarmPython) -> tuple[int | None, int | None, ExecResult]:
        pid = wp.pid
        task = asyncio.ensure_future(wp.run_code("import time; time.sleep(30)"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pid, wp.pid, await wp.run_code("print('fine')")

    old, gone, after = with_wp(go)
    assert gone is None and after.stdout == "fine\n"
    assert not Path(f"/proc/{old}").exists()


def test_pool_integration_and_unsafe_refused(tmp_path):
    (tmp_path / "task.txt").write_text("original")

    async def go(pool: SandboxPool) -> list[str]:
        out = []
        for _ in range(2):
            async with acquire_warm(pool) as wp:
                r = await wp.run_code(
                    "print(open('task.txt').read()); open('task.txt', 'w').write('x')"
                )
                out.append(r.stdout)
        return out

    with SandboxPool(1, template=tmp_path, config=CFG) as pool:
        assert asyncio.run(go(pool)) == ["original\n"] * 2
    with pytest.raises(SandboxError, match="isolation"):
        WarmPython.start(config=SandboxConfig(unsafe_no_isolation=True))


# --- attacks through the zygote --------------------------------------------------------


def test_read_host_files(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    secret.chmod(0o644)
    paths = [str(secret), "/etc/shadow", str(REPO / "pyproject.toml"), "/proc/1/root/etc/shadow"]
    r = code(f"""
        import os
        for p in {paths!r}:
            try:
                print(open(p).read())
            except OSError as e:
                print("denied", e.errno)
    """)  # fmt: skip
    assert r.stdout.count("denied") == len(paths) and not leaked(r), r


def test_write_outside_workspace(tmp_path):
    targets = [tmp_path / f"evil-{uuid.uuid4().hex}", Path("/usr/bin") / f"evil-{uuid.uuid4().hex}"]
    r = with_wp(lambda wp: wp.run_argv(["sh", "-c", "; ".join(f"echo x > {t}" for t in targets)]))
    assert r.exit_code != 0 and not any(t.exists() for t in targets)


def test_tcp_to_host_loopback_listener():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.2)
        port = srv.getsockname()[1]
        r = code(
            f"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('connected')"
        )
        with pytest.raises(TimeoutError):
            srv.accept()
    assert r.exit_code != 0 and "connected" not in r.stdout


def test_parent_environment_secret(monkeypatch):
    monkeypatch.setenv("TAURL_TEST_SECRET", SECRET)
    r = code("""
        import os
        print(dict(os.environ))
        for p in os.listdir('/proc'):
            if p.isdigit():
                try:
                    print(open(f'/proc/{p}/environ', 'rb').read())
                except OSError:
                    pass
    """)  # fmt: skip
    assert r.ok and not leaked(r) and "TAURL_TEST_SECRET" not in r.stdout


def test_zygote_pipes_and_memory_are_out_of_reach():
    # The zygote is non-dumpable: a request cannot forge answers through its fds or mem.
    r = code("""
        import os
        pp = os.getppid()
        for p in (f'/proc/{pp}/fd/1', f'/proc/{pp}/fd/3', f'/proc/{pp}/fd/4', f'/proc/{pp}/mem'):
            try:
                open(p, 'wb').write(b'\\0\\0\\0\\2{}'); print('opened', p)
            except OSError as e:
                print('denied', e.errno)
    """)  # fmt: skip
    assert r.ok and "opened" not in r.stdout and r.stdout.count("denied") == 4, r


def test_fork_bomb_is_bounded_and_cleaned_up():
    marker = "zforkbomb-" + uuid.uuid4().hex

    async def go(wp: WarmPython) -> list[ExecResult]:
        bomb = await wp.run_code(textwrap.dedent(f"""
            import os, time
            n = 0
            try:
                while n < 500:
                    if os.fork() == 0:
                        os.execvp("sleep", ["{marker}", "30"])
                    n += 1
            except OSError:
                pass
            print(n)
        """))  # fmt: skip
        after = await wp.run_code(
            "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
        )
        return [bomb, after]  # fmt: skip

    bomb, after = with_wp(go)
    assert 0 < int(bomb.stdout) < LIMITS.nproc, bomb
    assert len(eval(after.stdout)) == 3, after  # init, the zygote, the request itself
    assert host_pids_with(marker) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


def test_memory_bomb():
    r = code("x = bytearray(2 << 30); print('allocated')")
    assert r.exit_code != 0 and "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_cpu_spin_then_zygote_still_serves():
    async def go(wp: WarmPython) -> list[ExecResult]:
        return [await wp.run_code("while True: pass", timeout_s=10), await wp.run_code("print(1)")]

    spin, after = with_wp(go)
    assert spin.exit_signal in (9, 24) and not spin.timed_out and spin.wall_s < 6, spin
    assert after.stdout == "1\n"


def test_sleep_past_timeout():
    async def go(wp: WarmPython) -> list[ExecResult]:
        return [
            await wp.run_argv(["sleep", "60"], timeout_s=0.5),
            await wp.run_code("import time; time.sleep(60)", timeout_s=0.5),
            await wp.run_code("print('next')"),
        ]

    argv, py, after = with_wp(go)
    for r in (argv, py):
        assert r.timed_out and r.killed_reason == "timeout" and r.exit_code == 137, r
        assert r.wall_s < 1.5
    assert after.stdout == "next\n"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_flood_output(stream):
    cmd = ["yes"] if stream == "stdout" else ["sh", "-c", "yes >&2"]
    r = with_wp(lambda wp: wp.run_argv(cmd, timeout_s=5))
    assert r.killed_reason == "output_limit" and r.wall_s < 5
    assert len(getattr(r, stream).encode()) <= LIMITS.max_output_bytes
    assert getattr(r, f"truncated_{stream}")


@pytest.mark.parametrize("timeout", [False, True], ids=["after_exit", "after_timeout"])
def test_orphans_do_not_outlive_the_request(timeout):
    marker = "zorphan-" + uuid.uuid4().hex
    src = f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["{marker}", "30"])  # a daemon in its own session
            os._exit(0)
        for _ in range(100):
            time.sleep(0.01)
            if any(b"{marker}" in open(f"/proc/{{p}}/cmdline", "rb").read()
                   for p in os.listdir("/proc") if p.isdigit()):
                print("daemon started")
                break
        {"time.sleep(30)" if timeout else ""}
    """

    async def go(wp: WarmPython) -> list[ExecResult]:
        first = await wp.run_code(textwrap.dedent(src), timeout_s=1.0)
        seen = await wp.run_code(
            f"import os; print([p for p in os.listdir('/proc') if p.isdigit() and "
            f"b'{marker}' in open(f'/proc/{{p}}/cmdline', 'rb').read()])"
        )
        return [first, seen]

    first, seen = with_wp(go)
    assert "daemon started" in first.stdout and first.timed_out == timeout, first
    assert seen.stdout == "[]\n"  # gone inside the sandbox before the next request
    assert host_pids_with(marker) == []


@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
def test_request_that_attacks_the_zygote_is_lost_and_the_zygote_restarts(how):
    sig = {"sigkill": signal.SIGKILL, "sigstop": signal.SIGSTOP}[how]

    async def go(wp: WarmPython) -> tuple[int | None, int | None, ExecResult, ExecResult]:
        old = wp.pid
        t = time.monotonic()
        r = await wp.run_code(f"import os, time; os.kill(os.getppid(), {int(sig)}); time.sleep(5)",
                              timeout_s=0.5)  # fmt: skip
        assert time.monotonic() - t < 4
        assert wp.restarts == 1
        return old, wp.pid, r, await wp.run_code("print('alive')")

    old, new, lost, after = with_wp(go)
    assert lost.killed_reason == LOST and lost.exit_code == 137 and not lost.ok, lost
    assert new is not None and new != old and after.stdout == "alive\n"
    assert not Path(f"/proc/{old}").exists()  # the old sandbox is gone, not just replaced
