"""Config files in, validated dataclasses out: one check for YAML, dicts and Python objects.

`load_config` builds any config dataclass (`taurl.recipe.config.TrainConfig`, the rollout
config) from a YAML file, a dict and overrides, and reports every unknown key (with a "did
you mean"), wrong type and out-of-range value at once; `check_config` does the same for one
built in Python; `import_modules` imports a config's ``imports:`` first, so the envs they
register exist when the config names one.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import yaml

from taurl.errors import ConfigError
from taurl.recipe.options import SECTION_TYPES, section_fields
from taurl.recipe.sections import file_options, homes, merge, nest
from taurl.recipe.typed import (
    as_record,
    is_record,
    key_problems,
    option_class,
    record_value,
    type_name,
    type_ok,
    unknown_option,
)


def load_config(cls: type, data: dict[str, Any] | None = None, path: str | Path | None = None,
                overrides: dict[str, Any] | None = None):
    """Build `cls` from a YAML file, a dict and overrides (later wins); validate everything.

    Unknown keys (with a "did you mean"), wrong types and out-of-range values are all
    collected and raised together as one ConfigError. A sectioned config (TrainConfig)
    takes sections, dotted names (``"rl.lr"``) and the old flat names in each source; a
    file's flat keys are named with their new place in one warning.
    """
    loaded: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping of option: value")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if getattr(cls, "SECTIONED", False):  # its file is written in sections (taurl.recipe.sections)
        return _load_sectioned(cls, [nest(loaded, warn="file"), nest(data or {}), nest(given)])
    merged = {**loaded, **(data or {}), **given}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    problems = _records(cls, merged, "")
    problems += _check(merged, set(fields), typing.get_type_hints(cls), "")
    if problems:
        raise ConfigError(problems)
    return _built(cls(**merged))


def _load_sectioned(cls: type, sources: list[dict[str, Any]]):
    merged: dict[str, Any] = {}
    for source in sources:
        merged = merge(merged, source)
    top = {f.name for f in dataclasses.fields(cls) if f.name not in SECTION_TYPES}
    hints = typing.get_type_hints(cls)
    top_values = {k: v for k, v in merged.items() if k not in SECTION_TYPES}
    names = top | set(homes()) | {f"{s}.{f.name}" for s in SECTION_TYPES for f in section_fields(s)}
    problems = _records(cls, top_values, "")
    problems += _check(top_values, top, hints, "", names)
    merged = {**{k: v for k, v in merged.items() if k in SECTION_TYPES}, **top_values}
    for name in SECTION_TYPES:
        if name in merged and not isinstance(merged[name], dict):
            problems.append(f"{name} must be a mapping of its options (got {merged[name]!r})")
            merged.pop(name)
        elif name in merged:
            section_hints = typing.get_type_hints(SECTION_TYPES[name])
            problems += _records(SECTION_TYPES[name], merged[name], f"{name}.")
            problems += _check(merged[name], set(merged[name]), section_hints, f"{name}.")
    if problems:
        raise ConfigError(problems)
    return _built(cls(**merged))


def _records(cls: type, values: dict[str, Any], prefix: str) -> list[str]:
    """The typed options of `cls` in `values` (mappings, or records built in Python) made
    records of their classes, in place; the unknown keys and wrong types found (such an
    option is dropped, so the rest is still checked)."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name in values and is_record(f):
            option = option_class(f)
            if problems := key_problems(prefix + f.name, option, values[f.name]):
                out += problems
                values.pop(f.name)
            else:
                values[f.name] = as_record(prefix + f.name, option, values[f.name])
    return out


def _check(values: dict[str, Any], known: set[str], hints: dict[str, Any], prefix: str,
           names: set[str] | None = None) -> list[str]:
    """Unknown keys (a "did you mean" from `names`) and wrong types; they are dropped."""
    problems = []
    for key in list(values):
        if key not in known:
            problems.append(unknown_option(key, names or known))
            values.pop(key)
        elif not type_ok(values[key], hints[key]):
            problems.append(f"{prefix}{key} must be {type_name(hints[key])} (got {values[key]!r})")
            values.pop(key)
    return problems


def _built(cfg: Any) -> Any:
    if hasattr(cfg, "problems") and (more := cfg.problems()):
        raise ConfigError(more)
    return cfg


def option_problems(place: str, cls: type, value: Any) -> list[str]:
    """Every problem with the mapping `value` of option class `cls` ({} is off): unknown keys
    (with a "did you mean"), wrong types, then the class's own ``problems()``."""
    if not value and isinstance(value, dict):
        return []
    return key_problems(place, cls, value) or option_value(cls, value).problems()


def option_value(cls: type, value: Any) -> Any:
    """`value` as an instance of its option class (lists where the class holds tuples)."""
    return value if isinstance(value, cls) else record_value(cls, value)


def typed_option_problems(cfg: Any) -> list[str]:
    """The range problems of every typed option of a config (`taurl.recipe.options.typed`:
    a record's ``problems()``; a `typed_mapping`'s keys, types and ``problems()``)."""
    places = [(f.name, f, cfg) for f in dataclasses.fields(cfg) if f.name not in SECTION_TYPES]
    if getattr(cfg, "SECTIONED", False):
        places += [(f"{name}.{f.name}", f, getattr(cfg, name)) for name in SECTION_TYPES
                   for f in section_fields(name)]
    out = []
    for place, f, holder in places:
        if (cls := option_class(f)) is not None:
            out += option_problems(place, cls, getattr(holder, f.name))
    return out


def import_modules(config_path: str | None, cli_imports: list[str] | None) -> list[str]:
    """Import the config's `imports` and the --import modules (before the config is
    validated: their envs must be registered by then); returns them, in order."""
    from_file: list[str] = []
    if config_path and Path(config_path).is_file():
        try:
            data = yaml.safe_load(Path(config_path).read_text()) or {}
        except yaml.YAMLError:
            data = {}  # load_config reports the YAML error with its location
        if isinstance(data, dict) and isinstance(data.get("imports"), list):
            from_file = [str(m) for m in data["imports"]]
    modules = list(dict.fromkeys(from_file + list(cli_imports or [])))
    from taurl.envs import import_env_modules

    import_env_modules(modules)
    return modules


def check_config(cfg: Any) -> Any:
    """`cfg` (a config dataclass built in Python, e.g. ``TrainConfig(updates="30")``) checked as
    `load_config` checks a file: its `imports` imported, then every type, value and option;
    one ConfigError with every problem. Returns the validated config."""
    from taurl.envs import import_env_modules

    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise ConfigError(f"expected a config such as TrainConfig(...), got {type(cfg).__name__}")
    data = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    imports = data.get("imports")
    if isinstance(imports, (list, tuple)) and all(isinstance(m, str) for m in imports):
        import_env_modules(imports)  # their envs must be registered before the env is checked
    return load_config(type(cfg), data=data)


def dump_config(cfg: Any) -> str:
    """`cfg` as YAML that `load_config` reads back (in sections, for a sectioned config)."""
    if not getattr(cfg, "SECTIONED", False):
        return yaml.safe_dump(file_options(cfg), sort_keys=False)
    return yaml.safe_dump(json.loads(json.dumps(file_options(cfg))), sort_keys=False)
