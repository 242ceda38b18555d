"""Every `taurl train` / `taurl demo` command the pages publish (README.md, docs/, BENCHMARKS.md)
spells its options as the sections do (`--rl.updates`, `--sft.data`): a copied command prints
no deprecation warning. The old flat flags (`--updates`, `--sft`; `taurl.recipe.sections.LEGACY`)
still parse, hidden from `--help`, so only this test notices a page that keeps one; and every
flag a command names must be one `taurl train` knows, so a misspelled new flag fails here too."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import re
import sys
from pathlib import Path

import pytest

from taurl.cli.config_flags import config_overrides
from taurl.cli.main import build_parser
from taurl.recipe.config import TrainConfig
from taurl.recipe.sections import LEGACY

ROOT = Path(__file__).resolve().parents[1]
# `taurl train`, `.venv/bin/taurl demo`, `python -m taurl.cli.main train`
COMMAND = re.compile(r"taurl(?:\.cli\.main)? (?:train|demo)\b")
END = re.compile(r"`|\||;|&&|#|\n")  # where a command ends on a page
QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")  # JSON values: their keys are not flags
FLAG = re.compile(r"(?<![\w.$-])--[a-z][\w.-]*")


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]


def commands(text: str) -> list[str]:
    """The `taurl train` / `taurl demo` command lines of a page, continuation lines joined."""
    text = text.replace("\\\n", " ")
    return [m.group(0) + END.split(text[m.end():], 1)[0] for m in COMMAND.finditer(text)]


def flags(command: str) -> list[str]:
    """The flags of a command, quoted values left out."""
    return FLAG.findall(QUOTED.sub("''", command))


def old_flag(flag: str) -> str | None:
    """The new spelling of a deprecated flat flag (`--sft-epochs` -> `--sft.epochs`), else None."""
    place = LEGACY.get(flag.removeprefix("--").replace("-", "_"))
    if place is None:
        return None
    section, key = place.split(".")
    return f"--{section}.{key.replace('_', '-')}"


def train_flags() -> set[str]:
    """The flags `taurl train --help` lists (the hidden flat ones left out)."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {s for a in sub.choices["train"]._actions if a.help != argparse.SUPPRESS
            for s in a.option_strings}


def test_the_parser_finds_old_and_new_flags():
    page = ("Run `taurl train --config c.yaml --sft-epochs 1 --rl.lr 0.1` or\n```bash\n"
            ".venv/bin/taurl demo --model m \\\n"
            "    --dpo '{\"--lr\": 1}' --run-dir r  # --updates\n"
            "taurl eval runs/x --tasks 4\n```\n")
    cmds = commands(page)
    assert [flags(c) for c in cmds] == [["--config", "--sft-epochs", "--rl.lr"],
                                        ["--model", "--dpo", "--run-dir"]]
    assert [old_flag(f) for f in flags(cmds[1])] == ["--policy.model", "--rl.dpo", None]
    assert old_flag("--eval-tasks") == "--eval.tasks" and old_flag("--sft") == "--sft.data"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_published_commands_use_the_section_flags(page):
    known = train_flags()
    found = [(cmd, f) for cmd in commands(page.read_text()) for f in flags(cmd)]
    old = [f"{f} -> {old_flag(f)} in: {cmd.strip()[:90]}" for cmd, f in found if old_flag(f)]
    assert old == [], "deprecated flat flags (they print a warning):\n" + "\n".join(old)
    unknown = sorted({f for _, f in found if f not in known})
    assert unknown == [], f"flags `taurl train --help` does not list: {unknown}"


def _smoke():
    """benchmarks/smoke.py (the smoke tier; its table is benchmarks/smoke_table.py)."""
    if "bench_smoke" not in sys.modules:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        spec = importlib.util.spec_from_file_location("bench_smoke", ROOT / "benchmarks/smoke.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_smoke"] = module  # its dataclass looks its module up
        spec.loader.exec_module(module)
    return sys.modules["bench_smoke"]


def test_smoke_commands_parse_without_a_warning(tmp_path, caplog):
    """The smoke tier runs each published command plus budget flags: the budget spells a flag
    as the command does (`--rl.updates 20 ... --rl.updates 1`), since an old flag beside its
    new one is an error ("given twice") and an old one alone warns."""
    smoke, parser, ran = _smoke(), build_parser(), 0
    for c in smoke.COMMANDS:
        argv = smoke.invocation(c, tmp_path).argv
        if "taurl.cli.main" not in argv:
            continue
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            config_overrides(parser.parse_args(argv[argv.index("taurl.cli.main") + 1:]),
                             TrainConfig)
        assert not [r for r in caplog.messages if "deprecated" in r], c.published
        ran += 1
    assert ran >= 15  # taurl demo / taurl train entries
