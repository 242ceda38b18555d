"""Every benchmark command BENCHMARKS.md publishes has an entry in the smoke table
(benchmarks/smoke_table.py, run by `make bench-smoke`), so a figure cannot be published
without its command being run with a tiny budget; the table's commands are still the pages'."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("bench_smoke", ROOT / "benchmarks/smoke.py")
smoke = importlib.util.module_from_spec(_spec)
sys.modules["bench_smoke"] = smoke  # its dataclass looks its module up
_spec.loader.exec_module(smoke)
Command = smoke.Command


def _flat(text: str) -> str:
    """A page's text with continuation lines joined and runs of whitespace made one space."""
    return re.sub(r"\s+", " ", text.replace("\\\n", " "))


def published_names(text: str) -> tuple[set[str], set[str]]:
    """The scripts (`benchmarks/X.py`; `python X.py` after `cd benchmarks`) and configs a page
    names."""
    scripts = set(re.findall(r"benchmarks/(\w+\.py)", text))
    scripts |= set(re.findall(r"(?:python3?|\.venv/bin/python) (\w+\.py)", text))
    return scripts, set(re.findall(r"configs/\w+\.yaml", text))


def test_every_published_script_and_config_has_a_smoke_command():
    scripts, configs = published_names((ROOT / "BENCHMARKS.md").read_text())
    assert {
        "rollout.py",
        "vs_trl.py",
        "long_credit.py",
    } <= scripts and "configs/demo.yaml" in configs
    table = " ".join(c.published for c in smoke.COMMANDS)
    covered = set(re.findall(r"(\w+\.py)", table))
    assert scripts - covered == set(), "published benchmark scripts without a smoke_table entry"
    assert {c for c in configs if c not in table} == set(), "published configs without an entry"


def test_the_parser_finds_a_new_figures_command():
    page = (
        "| new | 1.0 | today | x |\n\n```bash\n.venv/bin/python benchmarks/new_thing.py \\\n"
        "    --flag\ntaurl train --config configs/new.yaml\ncd benchmarks && python other.py\n```\n"
    )
    assert published_names(page) == ({"new_thing.py", "other.py"}, {"configs/new.yaml"})


@pytest.mark.parametrize("c", smoke.COMMANDS, ids=lambda c: c.published[:60])
def test_each_command_is_still_on_its_page_and_its_script_exists(c, tmp_path):
    page = _flat((ROOT / c.source).read_text())
    assert _flat(c.published) in page, f"{c.source} no longer prints this command"
    inv = smoke.invocation(c, tmp_path)
    assert inv.argv[0] == sys.executable
    for arg in inv.argv[1:]:
        if arg.endswith(".py") or arg.startswith("tests/"):
            rel = (inv.cwd / arg).relative_to(tmp_path)
            assert (ROOT / rel).exists(), f"{rel} does not exist"
    budget = inv.argv[len(inv.argv) - len(c.budget) :] if c.budget else []
    assert budget == list(c.budget)  # the published flags come first, unchanged; budget last
    assert all(
        n in smoke.PREREQUISITES or n == "tiny-run" or n.startswith("module:") for n in c.needs
    )


def test_every_page_command_keeps_its_flags_in_order(tmp_path):
    """Only placeholders change: the invocation, budget removed, is the filled published text."""
    c = next(c for c in smoke.COMMANDS if "long_credit.py" in c.published)
    inv = smoke.invocation(c, tmp_path)
    assert inv.cwd == tmp_path / "benchmarks"
    assert inv.argv[1 : -len(c.budget)] == [
        "long_credit.py",
        "--from",
        "../runs/fl8p09_sft6_s0",
        "--out",
        "../runs/credit6_s0",
        "--estimators",
        "grpo",
        "gigpo",
        "--options",
        '{"gigpo": {"gamma": 0.8}}',
        "--seeds",
        *map(str, range(21, 29)),
        "--updates",
        "20",
        "--jobs",
        "2",
        "--overrides",
        '{"all": {"lr": 0.0003, "eval_temperature": 1.0, "eval_trials": 4}}',
    ]


@pytest.mark.parametrize(
    "script", ["credit.py", "sandbox.py", "beyond_rl.py", "async.py", "smoke.py"]
)
def test_help_works(script):
    p = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout


def test_the_tier_fails_on_a_broken_command_and_skips_a_missing_prerequisite(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(
        smoke,
        "COMMANDS",
        (
            Command("python benchmarks/smoke.py --list", ("--match", "no command has this text")),
            Command("python benchmarks/smoke.py", ("--no-such-flag",)),
            Command("python benchmarks/smoke.py", needs=("module:no_such_module_here",)),
        ),
    )
    assert smoke.main(["--workspace", str(tmp_path), "--groups", "none"]) == 1
    out = capsys.readouterr().out
    assert "1 ok, 1 failed, 1 skipped" in out
    assert "unrecognized arguments: --no-such-flag" in out  # the broken command's stderr tail
    assert "python module no_such_module_here not installed" in out


def test_the_sed_line_of_the_long_horizon_page_still_applies(tmp_path):
    ws = smoke.make_workspace(tmp_path)
    assert "policy: none" in (ws / "none.yaml").read_text()
    assert (ws / "benchmarks/rollout.py").resolve() == ROOT / "benchmarks/rollout.py"


def test_no_benchmark_reads_a_path_of_the_development_machine():
    """async.py --real and --check read `/work/main/runs/demo` when given no --policy: on a
    fresh clone the published command failed; the default is now the clone's runs/demo."""
    hits = [p.name for p in (ROOT / "benchmarks").glob("*.py") if '"/work/' in p.read_text()]
    assert hits == []
