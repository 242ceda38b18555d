"""`taurl sandbox exec`: smoke runs of the CLI, in process, each in a real sandbox."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from taurl.cli.main import main


def test_exec_passes_output_and_status_through(capsys):
    rc = main(["sandbox", "exec", "--", "python3", "-c", "import sys; print('out'); sys.exit(5)"])
    assert rc == 5 and capsys.readouterr().out == "out\n"


def test_exec_timeout_is_124_and_said(capsys):
    rc = main(["sandbox", "exec", "--timeout", "0.3", "--", "sleep", "5"])
    assert rc == 124 and "killed (timeout)" in capsys.readouterr().err


def test_exec_json_limits_env_and_workspace(capsys, monkeypatch):
    monkeypatch.setenv("TAURL_TEST_SECRET", "hunter2")
    with tempfile.TemporaryDirectory() as d:
        Path(d, "data.txt").write_text("from the template")
        rc = main(
            [
                "sandbox", "exec", "--json", "--max-output-kb", "1", "--env", "GREETING=hi",
                "--workspace", d, "--", "sh", "-c",
                "cat data.txt; echo; echo $GREETING $TAURL_TEST_SECRET; head -c 5000 /dev/zero",
            ]
        )
        # a copy ran, not the original
        assert Path(d, "data.txt").read_text() == "from the template"
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["isolated"] and out["stdout"].startswith("from the template\nhi\n")
    assert (
        "hunter2" not in out["stdout"]
        and out["truncated_stdout"]
        and out["stdout_bytes"] == 17 + 1 + 3 + 5000
    )
    assert out["command"][0] == "sh"


def test_exec_argument_errors(capsys):
    assert main(["sandbox", "exec"]) == 1
    assert "no command given" in capsys.readouterr().err
    assert main(["sandbox", "exec", "--timeout", "0", "--env", "NOPE", "--", "true"]) == 1
    err = capsys.readouterr().err
    assert "timeout_s must be > 0" in err and "--env 'NOPE'" in err
    assert main(["sandbox"]) == 1 and "taurl sandbox exec" in capsys.readouterr().err


def test_exec_cannot_touch_the_host(capsys):
    marker = Path(tempfile.gettempdir(), f"taurl-cli-{os.getpid()}")
    rc = main(["sandbox", "exec", "--", "sh", "-c", f"touch {marker}; cat /root/.bashrc; id -u"])
    assert not marker.exists() and capsys.readouterr().out.strip() == "1000" and rc == 0
