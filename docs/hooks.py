"""mkdocs hooks: the reference pages are generated from the code, never copied by hand.

A page asks for a generated block with an HTML comment on a line of its own:

    <!-- gen:cli -->                    `taurl --help` and `taurl COMMAND --help` of every command
    <!-- gen:config NAME -->            the option table of a config dataclass (taurl.recipe.config.NAME)
    <!-- gen:export-fields -->          the trajectory export's fields (taurl.data.export.EXPORT_FIELDS)
    <!-- gen:ledger-rules -->           every rule the ledger can refuse a record by (taurl.data.admission.RULES)
    <!-- gen:glossary -->               every metric key with its formula (taurl.monitor GLOSSARY + TRAIN_GLOSSARY)
    <!-- gen:estimators -->             the advantage estimators by name (taurl.credit.registry.ESTIMATORS)
    <!-- gen:objectives -->             the objectives by name (taurl.train.objectives.registry)

Pages under docs/ that the nav of mkdocs.yml does not list are added under "More", so a
page another change adds is never left out of the site.
"""

from __future__ import annotations

import importlib
import inspect
import io
import os
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # the checkout's code, whatever is installed

_MARK = re.compile(r"^<!-- gen:([a-z-]+)(?: (\S+))? -->$", re.M)


def _first_line(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split()).replace("|", "/")


def cli_help() -> str:
    """`taurl --help`, then each command's `--help`, as argparse prints them (100 columns)."""
    os.environ["COLUMNS"] = "100"
    from taurl.cli.main import build_parser

    return "\n".join(_help_blocks(build_parser(), "taurl"))


def _help_blocks(parser, prog: str) -> list[str]:
    """`prog --help`, then each sub-command's (and theirs: `taurl sandbox exec`)."""
    out = [f"### `{prog}`", "", "```text", parser.format_help().rstrip(), "```"]
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                out += ["", *_help_blocks(sub, f"{prog} {name}")]
    return out


def config_table(name: str) -> str:
    """The option table of one config dataclass (a sectioned one: every section's options,
    each row named by its place in the file and its flag)."""
    from taurl.cli.config_flags import options_table

    return options_table(getattr(importlib.import_module("taurl.recipe.config"), name))


def export_fields() -> str:
    from taurl.data.export import export_fields_markdown

    return export_fields_markdown()


def ledger_rules() -> str:
    from taurl.data.admission import RULES

    rows = [f"| `{k}` | {v.replace('|', '/')} |" for k, v in RULES.items()]
    return "\n".join(["| rule | refused when |", "|---|---|", *rows])


def glossary() -> str:
    from taurl.monitor.metrics import GLOSSARY
    from taurl.monitor.report import TRAIN_GLOSSARY

    merged = {**GLOSSARY, **TRAIN_GLOSSARY}
    rows = []
    for key in sorted(merged, key=lambda k: (k.split("/")[0], k)):
        keys = ", ".join(f"`{k.strip()}`" for k in key.split(", "))
        rows.append(f"| {keys} | {merged[key].replace('|', '/')} |")
    return "\n".join(["| key | formula |", "|---|---|", *rows])


def estimators() -> str:
    from taurl.credit.registry import ESTIMATORS

    rows = [f"| `{name}` | `{fn.__module__}.{fn.__name__}` | {_first_line(fn)} |"
            for name, fn in ESTIMATORS.items()]
    return "\n".join(["| `estimator:` | function | what it computes |", "|---|---|---|", *rows])


def objectives() -> str:
    from taurl.train.objectives import registry

    specs = next(v for k, v in vars(registry).items() if k.isupper() and isinstance(v, dict))
    rows = [f"| `{name}` | {spec.family} | `{spec.fn.__module__}.{spec.fn.__name__}` | {_first_line(spec.fn)} |"
            for name, spec in specs.items()]
    return "\n".join(["| `objective:` | family | function | what it computes |", "|---|---|---|---|", *rows])


GENERATORS = {"cli": cli_help, "config": config_table, "export-fields": export_fields,
              "ledger-rules": ledger_rules, "glossary": glossary, "estimators": estimators,
              "objectives": objectives}


def render(markdown: str) -> str:
    """Replace every ``<!-- gen:NAME [ARG] -->`` line with its generated block."""

    def one(m: re.Match) -> str:
        name, arg = m.group(1), m.group(2)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated block 'gen:{name}' (known: {', '.join(GENERATORS)})")
        with redirect_stdout(io.StringIO()):
            return GENERATORS[name](arg) if arg else GENERATORS[name]()

    return _MARK.sub(one, markdown)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (mkdocs hook signature)
    return render(markdown)


def _listed(nav) -> set[str]:
    out: set[str] = set()
    for item in nav or []:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            out |= _listed(value)
        elif isinstance(value, str):
            out.add(value)
    return out


def on_config(config):
    """Add the pages the nav does not list under "More" (sorted), so none is left out."""
    docs = Path(config["docs_dir"])
    listed = _listed(config["nav"])
    extra = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md"))
    extra = [p for p in extra if p not in listed]
    if extra and config["nav"] is not None:
        config["nav"].append({"More": extra})
    return config


try:  # the API reference's docstrings: doctest examples shown as code, not as Markdown
    import griffe

    class DoctestFences(griffe.Extension):
        """Fence each ``>>>`` example of a docstring as ``pycon``, so Markdown does not read its
        output (``[0.2366, 0.7634]``) as a link or its prompt as a quote."""

        def on_object(self, *, obj, **kwargs):  # noqa: ARG002 (griffe's hook signature)
            if obj.docstring is not None:
                obj.docstring.value = fence_doctests(obj.docstring.value)
except ImportError:  # griffe comes with mkdocstrings[python]; without it there is no API page
    pass


_RULER = re.compile(r"^=+( +=+)+$")


def fence_doctests(text: str) -> str:
    """Fence doctest examples (``>>>``) as ``pycon`` and reStructuredText simple tables (rows
    between ``====  ====`` rulers) as ``text``, so Markdown shows them as written."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>"):
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            out += ["```pycon", *lines[i:j], "```"]
            i = j
        elif _RULER.match(line.strip()):
            j = i + 1  # the table ends at a ruler followed by a blank line (or the end)
            while j < len(lines) and not (_RULER.match(lines[j].strip()) and
                                          (j + 1 == len(lines) or not lines[j + 1].strip())):
                j += 1
            out += ["```text", *lines[i:j + 1], "```"]
            i = j + 1
        else:
            out.append(line)
            i += 1
    return "\n".join(out)
