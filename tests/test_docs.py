"""The docs run as written: every block marked runnable in README.md and docs/ runs verbatim,
the site builds with no warning, and the generated reference pages are the code's.

The marker is an HTML comment on the line before a fenced block (invisible on GitHub and on
the site):

    <!-- runnable -->            run the block: bash/sh as a shell script, python with python
    <!-- runnable:NAME -->       write the block to the file NAME (read by a later block)

The blocks of one page run in order, in one fresh directory, with `taurl` on PATH. Keep them
fast: tiny budgets. A page may add checks of what its blocks produced (`CHECKS`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MARKER = re.compile(r"^<!-- runnable(?::(\S+))? -->\n```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
ANY_MARKER = re.compile(r"^<!-- runnable", re.M)  # a marker on a line of its own


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def runnable_blocks(path: Path) -> list[tuple[str | None, str, str]]:
    """(file name or None, language, code) of each marked block of `path`, in order."""
    text = path.read_text()
    blocks = [(m.group(1), m.group(2), m.group(3)) for m in MARKER.finditer(text)]
    assert len(blocks) == len(ANY_MARKER.findall(text)), (
        f"{path.relative_to(ROOT)}: a <!-- runnable --> marker is not directly "
        "followed by a fenced block"
    )
    return blocks


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def run_block(lang: str, code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    if lang in ("bash", "sh", "shell", "console"):
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    elif lang in ("python", "py"):
        cmd = [sys.executable, "-c", code]
    else:
        raise AssertionError(f"a runnable block must be bash or python, not {lang!r}")
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=900)


def check_reverse_run(cwd: Path) -> None:
    """docs/environments/your-own.md: the example env trained and evaluated, nothing lost."""
    check = run_block("python", "import my_envs; from taurl import envs; envs.check_env("
                      "envs.make('reverse-v0'), my_envs.reverse_tasks('train', 1)[0])", cwd)
    assert check.returncode == 0, check.stderr[-2000:]  # the example keeps the Env protocol
    assert len((cwd / "my_envs.py").read_text().splitlines()) <= 50  # "an env of ~40 lines"
    summary = json.loads((cwd / "runs/reverse/summary.json").read_text())
    assert summary["env"] == "reverse-v0" and summary["train"]["updates"] == 2
    for split in ("validation", "holdout"):
        for tag in ("sft", "final"):
            assert summary[split][tag]["episodes"] == 40  # 20 tasks x 2 trials, none lost
    assert summary["train"]["demos"] == 200
    # the glossary covers the run
    missing = undocumented_metrics(cwd / "runs/reverse/metrics.jsonl")
    assert not missing, (
        f"add {missing} with their formulas to "
        "taurl.monitor.report.TRAIN_GLOSSARY (docs/metrics.md)"
    )


def undocumented_metrics(metrics_jsonl: Path) -> list[str]:
    """The keys of a run's metrics.jsonl that docs/metrics.md (the glossary) does not explain."""
    from taurl.monitor.metrics import GLOSSARY
    from taurl.monitor.report import TRAIN_GLOSSARY

    names = [k.strip() for key in {**GLOSSARY, **TRAIN_GLOSSARY} for k in key.split(", ")]
    patterns = [
        re.compile("^" + ".+".join(re.escape(p) for p in re.split(r"<[^>]+>", k)) + "$")
        for k in names
    ]
    keys = {k for line in metrics_jsonl.read_text().splitlines() for k in json.loads(line)}
    return sorted(k for k in keys if not any(p.match(k) for p in patterns))


def check_frozenlake_run(cwd: Path) -> None:
    """README.md: the Python run wrote only metrics the glossary explains."""
    missing = undocumented_metrics(cwd / "runs/fl/metrics.jsonl")
    assert not missing, (
        f"add {missing} with their formulas to "
        "taurl.monitor.report.TRAIN_GLOSSARY (docs/metrics.md)"
    )


CHECKS = {"docs/environments/your-own.md": check_reverse_run, "README.md": check_frozenlake_run}
RUNNABLE = [p for p in pages() if runnable_blocks(p)]


@pytest.mark.parametrize("page", RUNNABLE, ids=page_id)
def test_runnable_blocks_run_verbatim(page, tmp_path):
    for name, lang, code in runnable_blocks(page):
        if name:
            (tmp_path / name).write_text(code)
            continue
        proc = run_block(lang, code, tmp_path)
        assert proc.returncode == 0, (
            f"{page_id(page)}: block failed:\n{code}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    if page_id(page) in CHECKS:
        CHECKS[page_id(page)](tmp_path)


def test_the_pages_with_runnable_blocks_are_found():
    ids = {page_id(p) for p in RUNNABLE}
    assert {"README.md", "docs/environments/your-own.md"} <= ids, ids


def test_readme_is_short_and_its_links_and_benchmarks_links_resolve():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
    for name in ("README.md", "BENCHMARKS.md"):
        links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / name).read_text())
        broken = [link for link in links if "://" not in link and not (ROOT / link).exists()]
        assert links and not broken, (name, broken)


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_pages_are_generated_from_the_code():
    """The config tables, export fields, ledger rules and glossary come from the code at
    build time, so a default, a field or a rule cannot drift from what the page says."""
    from taurl.cli.config_flags import options_table
    from taurl.data.admission import RULES
    from taurl.monitor.metrics import GLOSSARY
    from taurl.recipe.config import RolloutRunConfig, TrainConfig

    hooks = _hooks()
    config = hooks.render((ROOT / "docs/reference/config.md").read_text())
    for cls in (TrainConfig, RolloutRunConfig):
        assert options_table(cls) in config
    formats = hooks.render((ROOT / "docs/formats.md").read_text())
    assert all(f"`{rule}`" in formats for rule in RULES) and "`token_versions`" in formats
    glossary = hooks.render((ROOT / "docs/metrics.md").read_text())
    assert all(f"`{key.split(', ')[0]}`" in glossary for key in GLOSSARY)
    cli = hooks.render((ROOT / "docs/reference/cli.md").read_text())
    assert "### `taurl train`" in cli and "--schedule.staleness-eta" in cli
    assert "gen:" not in config + formats + glossary + cli
    with pytest.raises(ValueError, match="unknown generated block"):
        hooks.render("<!-- gen:no-such-block -->")


def test_design_citations_point_at_sections_of_the_design_page():
    """The code cites docs/design.md#SECTION; each section exists (and no DESIGN.md is cited)."""
    design = (ROOT / "docs/design.md").read_text()
    anchors = set(re.findall(r"\{#([a-z0-9-]+)\}", design))
    cited = set()
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        text = path.read_text()
        assert "DESIGN.md" not in text or path.name == "test_docs.py", f"{path} cites DESIGN.md"
        cited |= set(re.findall(r"docs/design\.md#([a-z0-9-]+)", text))
    assert cited and cited <= anchors, (
        f"cited sections missing from docs/design.md: {cited - anchors}"
    )


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed (pip install -e '.[docs]'): the site build is not checked",
)
def test_site_builds_strict(tmp_path):
    """`make docs`: every link, anchor and generated block resolves, with no warning."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr[-4000:]
    assert (tmp_path / "site/reference/config/index.html").exists()


NOT_PYTHON = {"taurl.json", "taurl.export_version"}  # a checkpoint's file; a Parquet metadata key


def test_every_module_and_name_the_docs_cite_exists():
    """`taurl.x.y` in README.md and docs/ (prose, code and figures; the experiment logs
    excepted: they are history)
    resolves to a module or an attribute, so a moved module cannot leave the docs behind."""
    import importlib

    stale = []
    for page in pages():
        if "experiments" in page.parts:
            continue
        for name in sorted(
            set(re.findall(r"(?<![\w./-])(taurl(?:\.\w+)+)", page.read_text())) - NOT_PYTHON
        ):
            parts = name.split(".")
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                    break
                except ImportError:
                    continue
            for attr in parts[i:]:
                obj = getattr(obj, attr, None)
            if obj is None:
                stale.append(f"{page_id(page)}: {name}")
    assert not stale, f"the docs name what the code no longer has: {stale}"
