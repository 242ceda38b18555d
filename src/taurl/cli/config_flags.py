"""Command-line flags and the reference table, generated from the config dataclasses.

An option's flag is its place in the file with ``-`` for ``_``: ``rl.lr`` is ``--rl.lr``,
``rl.tasks_per_update`` is ``--rl.tasks-per-update``, the top-level ``env_config`` is
``--env-config``. A field's comment (on its line, or the lines right above it) is its help
and its row in docs/reference/config.md. The flat flags of the release before sections
(``--lr``, ``--eval-tasks``) still parse, hidden from ``--help``, and warn once with the new
flag (`config_overrides`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import typing
from typing import Any


def field_docs(cls: type) -> dict[str, str]:
    """Each field's comment in its class's source (inherited fields included)."""
    return dict(_field_docs(cls))


# Once per class and process: every in-process CLI call builds the parser again, and
# inspect.getsource re-parses the whole module each time (CPython 3.11's parser is not safe
# to run in two threads at once: a parse beside an episode thread's raised a SystemError).
@functools.cache
def _field_docs(cls: type) -> tuple[tuple[str, str], ...]:
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        names = set(klass.__dict__.get("__annotations__", {}))
        above: list[str] = []
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):  # a class made at run time (make_dataclass): no comments
            continue
        for line in source.splitlines():
            text = line.strip()
            if text.startswith("#"):
                above.append(text[1:].strip())
                continue
            name, sep, rest = text.partition(":")
            if sep and name in names:
                own = rest.split("#", 1)[1].strip() if "#" in rest else ""
                docs[name] = own or " ".join(above)
            above = []
    return tuple(docs.items())


def field_default(f: dataclasses.Field) -> Any:
    """A field's default as the file writes it (a typed option's record: its mapping, {})."""
    from taurl.recipe.typed import is_record, record_mapping

    factory: Any = f.default_factory
    value = f.default if f.default is not dataclasses.MISSING else factory()
    return record_mapping(value) if is_record(f) else value


def _rows(cls: type) -> list[tuple[str, str, dataclasses.Field, str, Any]]:
    """(place, flag, field, doc, hint) of every option of `cls`, sections after the top."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    if not getattr(cls, "SECTIONED", False):
        return [(f.name, f.name, f, docs.get(f.name, ""), hints[f.name])
                for f in dataclasses.fields(cls)]
    from taurl.recipe.options import SECTION_TYPES, section_fields

    out = [(f.name, f.name, f, docs.get(f.name, ""), hints[f.name])
           for f in dataclasses.fields(cls) if f.name not in SECTION_TYPES]
    for name, section in SECTION_TYPES.items():
        sdocs, shints = field_docs(section), typing.get_type_hints(section)
        out += [(f"{name}.{f.name}", f"{name}.{f.name}", f, sdocs.get(f.name, ""), shints[f.name])
                for f in section_fields(name)]
    return out


def options_table(cls: type) -> str:
    """The option table of a config class (docs/reference/config.md is generated with it)."""
    from taurl.recipe.sections import LEGACY

    was = {home: flat for flat, home in LEGACY.items()} if getattr(cls, "SECTIONED", False) else {}
    rename = {"imports": "import"}
    rows = []
    for place, flag, f, doc, _ in _rows(cls):
        old = f"; was `{was[place]}`" if place in was else ""
        if where := f.metadata.get("options"):  # a typed option: its class declares the keys
            name = where if isinstance(where, str) else f"{where.__module__}:{where.__qualname__}"
            doc += f" (keys, types and defaults: `{name.replace(':', '.')}`)"
        flag = "--" + rename.get(flag, flag).replace("_", "-")
        rows.append(f"| `{place}` (`{flag}`{old}) | `{json.dumps(field_default(f))}` | "
                    f"{doc.replace('|', '/')} |")
        if where:
            rows += _key_rows(place, f)
    return "\n".join(["| option in the file (flag) | default | meaning |", "|---|---|---|", *rows])


def _key_rows(place: str, f: dataclasses.Field) -> list[str]:
    """A row per key of a typed option (`taurl.recipe.options.typed`): its default and its
    comment in the option class, the one place they are written."""
    from taurl.recipe.typed import option_class

    cls = option_class(f)
    docs = field_docs(cls)
    out = []
    for key in dataclasses.fields(cls):
        default = field_default(key)
        default = list(default) if isinstance(default, tuple) else default
        out.append(f"| `{place}.{key.name}` (a key of `{place}`) | `{json.dumps(default)}` | "
                   f"{docs.get(key.name, '').replace('|', '/')} |")
    return out


def add_config_flags(p: argparse.ArgumentParser, cls: type) -> None:
    """One --flag per option (its comment is its help); for a sectioned config, the old
    flat flags too, hidden."""
    for place, flag, f, doc, hint in _rows(cls):
        if f.name == "imports":
            continue  # --import MODULE (repeatable), added by the command
        _add(p, "--" + flag.replace("_", "-"), place, hint,
             f"{doc} (default: {field_default(f)!r})")
    if getattr(cls, "SECTIONED", False):
        from taurl.recipe.sections import LEGACY

        hints = {place: hint for place, _, _, _, hint in _rows(cls)}
        for flat, place in LEGACY.items():
            if place in hints:
                _add(p, "--" + flat.replace("_", "-"), f"flat:{flat}", hints[place],
                     argparse.SUPPRESS)


def _add(p: argparse.ArgumentParser, flag: str, dest: str, hint: Any, help_: str) -> None:
    args = typing.get_args(hint)
    metavar = dest.rsplit(".", 1)[-1].removeprefix("flat:").upper()
    if hint in (int, float, str):
        p.add_argument(flag, dest=dest, type=hint, default=None, metavar=metavar, help=help_)
    elif len(args) == 2 and type(None) in args and args[0] in (int, float, str):  # int | None
        p.add_argument(flag, dest=dest, type=args[0], default=None, metavar=metavar, help=help_)
    else:
        suffix = "" if help_ == argparse.SUPPRESS else " — JSON"
        p.add_argument(flag, dest=dest, type=json.loads, default=None, metavar=metavar,
                       help=help_ + suffix)


def config_overrides(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The options given on the command line (`add_config_flags`), at their places; the old
    flat flags with one warning naming their new flags."""
    given = {k: v for k, v in vars(args).items() if v is not None and k != "imports"}
    places = {place for place, *_ in _rows(cls)}
    options = {k: v for k, v in given.items() if k in places}
    if not getattr(cls, "SECTIONED", False):
        return options
    from taurl.recipe.sections import nest

    flat = {k.removeprefix("flat:"): v for k, v in given.items() if k.startswith("flat:")}
    return nest({**options, **flat}, warn="flag")  # --lr with --rl.lr: "given twice"
