"""Run every published benchmark command with a tiny budget (`make bench-smoke`).

A figure in BENCHMARKS.md is only as good as its command: a config or a script that changes
under it (configs/demo.yaml turning on `rollout.deterministic`, which the async schedule
refuses, broke `vs_trl.py`'s async settings) leaves a number nobody can reproduce. This tier
runs each command of `smoke_table.COMMANDS` as its page prints it, plus only budget flags, and
fails when one exits non-zero, printing which one and its stderr tail.

    .venv/bin/python benchmarks/smoke.py                       # every group whose needs are met
    .venv/bin/python benchmarks/smoke.py --groups none tiny-run
    .venv/bin/python benchmarks/smoke.py --list                # the commands, as they would run

Commands run in a scratch workspace that looks like a fresh clone from the command's point of
view (configs/, tests/, benchmarks/*.py linked; runs/ and benchmarks/figures/ its own), so
relative paths such as `runs/demo` mean the tiny runs made here and no figure or run of the
clone is overwritten. `python`, `.venv/bin/python` and `taurl` become this interpreter (and
`-m taurl.cli.main`), with the clone's src/ on PYTHONPATH.

Groups, by what a command needs: none; tiny-run (the first commands of the table make the
tiny runs); vllm (.venv-vllm); real-model (SmolLM2-135M-Instruct converted into
~/.cache/taurl/models); qwen-model (Qwen2.5-Coder-0.5B-Instruct there, `make real-code`); trl
(TRL's venv at $PEER_DIR/trl-venv); cuda. A command whose
prerequisite is missing is SKIPPED with the reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smoke_table import COMMANDS, QWEN, REAL, Command  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("none", "tiny-run", "vllm", "real-model", "qwen-model", "trl", "cuda")
_BY_WEIGHT = (
    "cuda",
    "qwen-model",
    "real-model",
    "trl",
    "vllm",
    "tiny-run",
)  # a command's group: its heaviest need
PYTHONS = {"python", "python3", ".venv/bin/python"}
TAURLS = {"taurl", ".venv/bin/taurl"}
KEEP_OWN = {"benchmarks", "runs", "site"}  # what the commands write: the workspace's own


def group_of(c: Command) -> str:
    """The heaviest need; a command that makes a tiny run is in the tiny-run group."""
    needs = (*c.needs, "tiny-run") if c.provides else c.needs
    return next((g for g in _BY_WEIGHT if g in needs), "none")


def _cuda() -> str:
    import torch

    return "" if torch.cuda.is_available() else "no CUDA device"


def _peer_python() -> Path | None:
    peer = os.environ.get("PEER_DIR", "")
    return Path(peer) / "trl-venv" / "bin" / "python" if peer else None


PREREQUISITES: dict[str, Callable[[], str]] = {
    "vllm": lambda: (
        "" if (ROOT / ".venv-vllm/bin/python").exists() else "no .venv-vllm (make vllm-venv)"
    ),
    "real-model": lambda: (
        ""
        if (Path(REAL).expanduser() / "config.json").exists()
        else f"no {REAL} (make demo-real converts it)"
    ),
    "qwen-model": lambda: (
        ""
        if (Path(QWEN).expanduser() / "config.json").exists()
        else f"no {QWEN} (make real-code converts it)"
    ),
    "trl": lambda: (
        ""
        if (p := _peer_python()) is not None and p.exists()
        else "no TRL venv: PEER_DIR unset or $PEER_DIR/trl-venv/bin/python missing"
    ),
    "cuda": _cuda,
    "slow": lambda: "slow; run by `make test` already (--slow runs it here too)",
}


def missing(need: str, slow: bool, groups: list[str]) -> str:
    """Why `need` is not met here ('' when it is)."""
    if need == "tiny-run":
        return (
            "" if "tiny-run" in groups else "the tiny runs are the tiny-run group's (not selected)"
        )
    if need.startswith("module:"):
        name = need.split(":", 1)[1]
        return "" if importlib.util.find_spec(name) else f"python module {name} not installed"
    if need == "slow" and slow:
        return ""
    return PREREQUISITES[need]()


@dataclass(frozen=True)
class Invocation:
    """A published command as this tier runs it."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]


def invocation(c: Command, workspace: Path) -> Invocation:
    """The published text with its placeholders filled, the interpreter made this one, and the
    budget flags appended (nothing else changes)."""
    text = c.published
    values = {"ROOT": str(ROOT), "PEER_DIR": os.environ.get("PEER_DIR", "")}
    for key, value in c.fill.items():
        text = text.replace(key, value.format(**values))
    cwd = workspace
    if m := re.match(r"cd (\S+) && ", text):
        cwd, text = workspace / m.group(1), text[m.end() :]
    tokens = [os.path.expanduser(t) for t in shlex.split(text)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    while tokens and re.fullmatch(r"[A-Z_]+=.*", tokens[0]):
        name, _, value = tokens.pop(0).partition("=")
        if name != "PYTHONPATH":  # always the clone's src/
            env[name] = value
    prog, rest = tokens[0], tokens[1:]
    if prog in PYTHONS:
        head = [sys.executable]
    elif prog in TAURLS:
        head = [sys.executable, "-m", "taurl.cli.main"]
    else:
        raise ValueError(f"unknown program {prog!r} in {c.published!r}")
    return Invocation([*head, *rest, *c.budget], cwd, env)


def make_workspace(path: Path) -> Path:
    """A directory the commands run in: the clone's inputs linked, its outputs its own."""
    path.mkdir(parents=True, exist_ok=True)
    for item in ROOT.iterdir():  # configs/, examples/, src/, tests/, .venv-vllm, ...
        if item.name in KEEP_OWN or (item.name.startswith(".") and item.name != ".venv-vllm"):
            continue
        if not (path / item.name).exists():
            (path / item.name).symlink_to(item)
    bench = path / "benchmarks"
    (bench / "figures").mkdir(parents=True, exist_ok=True)
    for script in (ROOT / "benchmarks").glob("*.py"):
        if not (bench / script.name).exists():
            (bench / script.name).symlink_to(script)
    (path / "runs").mkdir(exist_ok=True)
    # the long-horizon page's `sed 's/policy: env .*/policy: none/' ... > /tmp/none.yaml`
    text = (ROOT / "configs/long_horizon.yaml").read_text()
    none, n = re.subn(r"policy: env .*", "policy: none", text)
    if n != 1:
        raise SystemExit("configs/long_horizon.yaml: the page's sed line no longer matches once")
    (path / "none.yaml").write_text(none)
    return path


def _link_beyond(workspace: Path) -> None:
    """beyond_rl.py reads runs/beyond/<stage>/: the tiny demo run stands in for the GRPO run."""
    beyond = workspace / "runs" / "beyond"
    beyond.mkdir(exist_ok=True)
    if not (beyond / "grpo").exists() and (workspace / "runs/demo").exists():
        (beyond / "grpo").symlink_to(workspace / "runs/demo")


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join("    " + x for x in text.rstrip().splitlines()[-lines:])


def run_one(c: Command, workspace: Path, timeout: float, index: int) -> tuple[bool, str]:
    """Run one command; (passed, a line or block to print)."""
    inv = invocation(c, workspace)
    logs = workspace / "logs"
    logs.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            inv.argv, cwd=inv.cwd, env=inv.env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return False, f"TIMEOUT after {timeout:.0f} s\n{_tail(err)}"
    (logs / f"{index:02d}.out").write_text(p.stdout)
    (logs / f"{index:02d}.err").write_text(p.stderr)
    if p.returncode == 0:
        return True, f"ok ({time.perf_counter() - t0:.0f} s)"
    return False, f"FAILED (exit {p.returncode})\n{_tail(p.stderr or p.stdout)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--groups", nargs="+", default=list(GROUPS), choices=GROUPS)
    ap.add_argument(
        "--match", nargs="+", default=[], help="only the commands whose text contains one of these"
    )
    ap.add_argument("--workspace", default="", help="run here (default: a new temporary directory)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per command")
    ap.add_argument(
        "--slow", action="store_true", help="also the commands `make test` already runs"
    )
    ap.add_argument("--list", action="store_true", help="print the commands as they would run")
    a = ap.parse_args(argv)
    workspace = make_workspace(Path(a.workspace or tempfile.mkdtemp(prefix="taurl-bench-smoke-")))
    print(f"workspace: {workspace}", flush=True)
    failed_runs: list[str] = []
    results: dict[str, list[str]] = {"ok": [], "failed": [], "skipped": []}
    for i, c in enumerate(COMMANDS):
        group = group_of(c)
        if a.match and not any(m in c.published for m in a.match):
            continue
        inv = invocation(c, workspace)
        shown = " ".join(shlex.quote(x) for x in inv.argv[1:])
        print(f"\n[{i:02d} {group}] {c.published}\n    runs: python {shown}", flush=True)
        if a.list:
            continue
        why = "" if group in a.groups else f"group {group} not selected"
        why = why or next((r for n in c.needs if (r := missing(n, a.slow, a.groups))), "")
        why = why or next((f"{r} failed" for r in failed_runs if r in " ".join(inv.argv)), "")
        if why:
            print(f"    SKIPPED: {why}", flush=True)
            results["skipped"].append(f"[{i:02d}] {c.published[:70]}: {why}")
            continue
        if "beyond_rl.py" in c.published:
            _link_beyond(workspace)
        passed, report = run_one(c, workspace, a.timeout, i)
        print("    " + report, flush=True)
        results["ok" if passed else "failed"].append(f"[{i:02d}] {c.published[:90]}")
        if not passed and c.provides:
            failed_runs.append(c.provides)
    if a.list:
        return 0
    print(
        f"\nbench-smoke: {len(results['ok'])} ok, {len(results['failed'])} failed, "
        f"{len(results['skipped'])} skipped (workspace {workspace})"
    )
    for kind in ("failed", "skipped"):
        for line in results[kind]:
            print(f"  {kind}: {line}")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
