"""Where each option lives in a training config file, and the old flat spellings.

    env: search-v0
    policy:   {model: "", size: tiny}
    rollout:  {max_turns: 3, max_action_tokens: 48, temperature: 1.0, concurrency: 64}
    engine:   {kind: local, options: {}}
    sft:      {data: expert, demos: 12000, epochs: 2, lr: 3.0e-3}
    rl:       {updates: 30, group_size: 8, estimator: grpo, lr: 5.0e-4}
    schedule: {kind: sync, staleness_eta: 1}
    train:    {strategy: single, world_size: 1}
    eval:     {tasks: 100, trials: 3, temperature: 1.0, seed: 1234}

The sections are dataclasses (`taurl.recipe.options`); an option has one spelling, its
place: ``rl.lr`` in YAML, ``cfg.rl.lr`` / ``rl={"lr": ...}`` in Python, ``--rl.lr`` on
the command line. Options not in a section (`TOP`: ``seed``, ``env``, ``imports``, ...)
stay at the top level.

The flat names of earlier releases (``lr``, ``eval_tasks``, ``--lr``, ``train(lr=...)``)
still load, with one warning naming each one's new place (`nest`); `LEGACY` lists them.
Reading them (``cfg.lr``) keeps working without a warning for now (`homes`: the legacy
names, and any section key that is unique across sections and not a top-level name).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Mapping
from typing import Any

from taurl.errors import ConfigError
from taurl.recipe.options import SECTION_TYPES, section_fields
from taurl.recipe.typed import as_record, is_record, option_class, record_mapping, unknown_option

log = logging.getLogger("taurl.recipe.config")

# the options that stay at the top level (TrainConfig's own fields)
TOP = frozenset({"seed", "env", "imports", "env_config", "system_prompt", "tasks", "task_options",
                 "alarms", "trackers", "promotion", "reward", "agent", "torch_threads"})

# the flat names of the release before sections, and where each lives now (frozen: a new
# option has no flat name, only its place)
_RENAMED = {"model_size": "policy.size", "engine": "engine.kind",
            "engine_options": "engine.options", "sft": "sft.data", "sft_data": "sft.file",
            "rl_seed": "rl.seed", "rl_max_seconds": "rl.max_seconds", "schedule": "schedule.kind",
            "train_strategy": "train.strategy", "train_world_size": "train.world_size"}
_PREFIXED = {"sft": ("epochs", "batch_size", "lr", "warmup_steps", "max_steps", "max_seconds"),
             "eval": ("tasks", "trials", "temperature", "seed")}
_SAME = {"policy": "model tokenizer_texts vocab_size chat_template warmup_options lora device "
                   "torch_dtype",
         "rollout": "max_turns max_action_tokens max_episode_tokens max_observation_tokens "
                    "max_context max_tool_calls temperature concurrency deterministic "
                    "generate_timeout_s backend backend_options compaction",
         "sft": "demos expert_options rejection",
         "rl": "updates tasks_per_update group_size keep_checkpoints checkpoint_every estimator "
               "estimator_options critic_lr vf_clip critic_epochs critic_warmup_updates "
               "step_scorer step_scorer_options replay curriculum objective objective_options "
               "eps_low eps_high aggregation segment_weighting lr lr_warmup_steps weight_decay "
               "grad_clip kl_coef kl_kind entropy_coef drop_zero_variance micro_batch_tokens "
               "epochs dpo teacher distill tis tis_cap",
         "schedule": "staleness_eta overprovision interrupt mask_stale",
         "train": "precision activation_checkpointing attention"}
LEGACY: dict[str, str] = {
    **_RENAMED,
    **{f"{sec}_{key}": f"{sec}.{key}" for sec, keys in _PREFIXED.items() for key in keys},
    **{key: f"{sec}.{key}" for sec, keys in _SAME.items() for key in keys.split()}}


def homes() -> dict[str, str]:
    """Every flat name that reads an option of a section: `LEGACY`, and each section key that
    is unique across the sections and is neither a top-level nor a section name."""
    return _homes(tuple(SECTION_TYPES.items()))


@functools.cache
def _homes(types: tuple[tuple[str, type], ...]) -> dict[str, str]:
    seen: dict[str, list[str]] = {}
    for name, _ in types:
        for f in section_fields(name):
            seen.setdefault(f.name, []).append(f"{name}.{f.name}")
    taken = set(LEGACY) | TOP | set(SECTION_TYPES)
    auto = {key: places[0] for key, places in seen.items() if len(places) == 1 and key not in taken}
    return {**auto, **LEGACY}


# where each flat name lives (`HOME`) and each section's keys with their flat names
# (`SECTIONS`), as the shipped sections declare them
HOME: dict[str, str] = dict(LEGACY)
SECTIONS: dict[str, dict[str, str]] = {
    name: {f.name: next((flat for flat, home in LEGACY.items() if home == f"{name}.{f.name}"),
                        f.name) for f in section_fields(name)}
    for name in SECTION_TYPES}


def options_of(name: str, section: Any) -> dict[str, Any]:
    """The options of a section instance, keyed and written as in the file (a typed
    option's record as its mapping: `taurl.recipe.typed.record_mapping`)."""
    return {f.name: record_mapping(v) if is_record(f) else v
            for f in section_fields(name) for v in [getattr(section, f.name)]}


_WARNING = {
    "file": ("flat config keys are deprecated; write them in sections: {} (they load for one more "
             "release; `python -m taurl.recipe.sections FILE` rewrites a file)", "{old} -> {new}"),
    "flag": ("flat flags are deprecated; use {} (they work for one more release)",
             "--{old_flag} -> --{new_flag}"),
    "keyword": ("flat keyword options are deprecated; use {} (they work for one more release)",
                "{old}=... -> {section}={{'{key}': ...}}"),
}


def nest(data: Mapping[str, Any], *, warn: str | None = None) -> dict[str, Any]:
    """`data` (a file's mapping, overrides or a Python dict) with every option at its place:
    ``{top: value, section: {key: value}}``. A section is a mapping (or a section instance);
    ``"rl.lr"`` is that option; a flat name of `homes` is moved to its place, and with `warn`
    (file | flag | keyword) ONE warning names the new spelling of each. A section name with a
    plain value (``sft: expert``) is the old flat option. Unknown section keys and an option
    given twice are ConfigErrors; unknown top-level keys are left for the loader to report."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # place -> how it was written, for "given twice"
    problems: list[str] = []
    moved: list[tuple[str, str]] = []
    places = homes()
    for key, value in data.items():
        if key in SECTION_TYPES and dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = options_of(key, value)
        if key in SECTION_TYPES and isinstance(value, Mapping):
            names = {f.name for f in section_fields(key)}
            for sub, v in value.items():
                if sub not in names:
                    problems.append(unknown_option(
                        sub, names, place=f"{key}.", quote=False,
                        holds=f"{key} holds {', '.join(sorted(names))}"))
                    continue
                _put(out, given, key, sub, v, f"{key}.{sub}", problems)
            continue
        place = key if "." in key else places.get(key)
        if place is None:
            out[key] = value  # a top-level option, or an unknown one (load_config names it)
            continue
        section, sub = place.split(".", 1)
        if section not in SECTION_TYPES:
            out[key] = value
            continue
        if "." not in key:
            moved.append((key, place))
        _put(out, given, section, sub, value, key, problems)
    if problems:
        raise ConfigError(problems)
    if warn and moved:
        template, item = _WARNING[warn]
        log.warning(template.format(", ".join(
            item.format(old=old, new=new, old_flag=old.replace("_", "-"),
                        new_flag=new.replace("_", "-"), section=new.split(".")[0],
                        key=new.split(".")[1]) for old, new in moved)))
    return out


def _put(out: dict[str, Any], given: dict[str, str], section: str, key: str, value: Any,
         written: str, problems: list[str]) -> None:
    place = f"{section}.{key}"
    part = out.setdefault(section, {})
    if place in given and part[key] != value:
        problems.append(f"{place} is given twice (as {given[place]} and as {written}); keep one")
    given.setdefault(place, written)
    part[key] = value


def merge(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Nested options `more` over `base`: a section's keys one by one, a later value wins."""
    out = {k: dict(v) if k in SECTION_TYPES and isinstance(v, dict) else v for k, v in base.items()}
    for key, value in more.items():
        if key in SECTION_TYPES and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def flatten(data: Mapping[str, Any], *, warn: bool = False) -> dict[str, Any]:
    """`data` with every option under its flat name (the release before sections; a run's
    identity in state.json is recorded so): ``{"rl": {"lr": 1e-3}}`` -> ``{"lr": 1e-3}``.
    An option with no flat name keeps its place, ``"rl.new_option"``."""
    return _flat(nest(data, warn="file" if warn else None))


def flat_options(cfg: Any) -> dict[str, Any]:
    """Every option of a TrainConfig under its flat name (`flatten`)."""
    return _flat(nest(file_options(cfg)))


def file_options(cfg: Any) -> dict[str, Any]:
    """Every option of a config as its file writes it: each section a mapping, each typed
    option's record a mapping (`taurl.recipe.typed.record_mapping`)."""
    return {f.name: (options_of(f.name, v) if f.name in SECTION_TYPES
                     else record_mapping(v) if is_record(f) else v)
            for f in dataclasses.fields(cfg) for v in [getattr(cfg, f.name)]}


def _flat(nested: dict[str, Any]) -> dict[str, Any]:
    flat_of = {home: flat for flat, home in homes().items()}
    out: dict[str, Any] = {}
    for key, value in nested.items():
        if key in SECTION_TYPES and isinstance(value, dict):
            for sub, v in value.items():
                out[flat_of.get(f"{key}.{sub}", f"{key}.{sub}")] = v
        else:
            out[key] = value
    return out


def build_config(cfg: Any, options: Mapping[str, Any]) -> None:
    """`TrainConfig.__init__`: set `cfg`'s fields from `options` — top-level names, sections
    (a mapping or a section instance), dotted (``"rl.lr"``) and flat names (``lr``, as
    `dataclasses.replace(cfg, lr=...)` passes them, with the sections as they are); an
    unknown name is a TypeError, as for any dataclass. No check here: `load_config` and
    `check_config` check."""
    fields = dataclasses.fields(cfg)
    top_names = {f.name for f in fields if f.name not in SECTION_TYPES}
    given: dict[str, Any] = {}
    patches: dict[str, dict[str, Any]] = {}
    places = homes()
    for key, value in options.items():
        is_section = isinstance(value, Mapping) or dataclasses.is_dataclass(value)
        if key in top_names or (key in SECTION_TYPES and is_section):
            given[key] = value
        elif (place := key if "." in key else places.get(key)) and \
                place.split(".")[0] in SECTION_TYPES:
            section, sub = place.split(".", 1)
            patches.setdefault(section, {})[sub] = value
        else:
            raise TypeError(f"TrainConfig got an unexpected option {key!r}")
    for f in fields:
        if f.name in SECTION_TYPES:
            value = _section(f.name, given.get(f.name), patches.get(f.name, {}))
        elif f.name in given:
            value = given[f.name]
            if is_record(f):  # a mapping given for a typed option (promotion: {...})
                value = as_record(f.name, option_class(f), value)
        else:
            factory = f.default_factory
            value = factory() if factory is not dataclasses.MISSING else f.default
        object.__setattr__(cfg, f.name, value)


def _section(name: str, value: Any, patch: dict[str, Any]) -> Any:
    cls = SECTION_TYPES[name]
    records = {f.name: c for f in section_fields(name) if is_record(f) and (c := option_class(f))}
    patch = {k: as_record(f"{name}.{k}", records[k], v) if k in records else v
             for k, v in patch.items()}
    if value is None:
        return cls(**patch)
    if isinstance(value, Mapping):
        value = {k: as_record(f"{name}.{k}", records[k], v) if k in records else v
                 for k, v in value.items()}
        return cls(**{**value, **patch})
    return dataclasses.replace(value, **patch) if patch else value


def flat_read(cfg: Any, name: str) -> Any:
    """`TrainConfig.__getattr__`: a flat name of `homes` reads its option (``cfg.lr`` is
    ``cfg.rl.lr``), for the code written before sections."""
    place = homes().get(name) if not name.startswith("__") else None
    section = cfg.__dict__.get(place.split(".")[0]) if place else None
    if section is None:
        raise AttributeError(f"{type(cfg).__name__!r} object has no attribute {name!r}")
    return getattr(section, place.split(".", 1)[1])


def sectioned(flat: Mapping[str, Any]) -> dict[str, Any]:
    """`flat` options written in sections: `nest` without a warning."""
    return nest(flat)


_ENTRY = re.compile(r"^([A-Za-z_]\w*):(.*)$")


def rewrite_in_sections(text: str) -> str:
    """A flat config file's text with its options moved into sections, comments kept: an
    option's own comment lines (right above it) move with it; a section is written where
    its first option was."""
    lines = text.splitlines()
    blocks: list[tuple[str | None, list[str]]] = []  # (flat key or None, lines)
    i = 0
    while i < len(lines):
        m = _ENTRY.match(lines[i])
        if not m:
            blocks.append((None, [lines[i]]))
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].startswith((" ", "\t")) and lines[j].strip():
            j += 1
        own: list[str] = []
        while blocks and blocks[-1][0] is None and blocks[-1][1][0].startswith("#"):
            own = blocks.pop()[1] + own  # its comment lines travel with it
        blocks.append((m.group(1), own + lines[i:j]))
        i = j
    by_section: dict[str, list[list[str]]] = {}
    for key, block in blocks:
        if key is None or key not in HOME or _is_section(key, block):
            continue
        section, sub = HOME[key].split(".")
        body, renamed = [], False
        for x in block:
            if not renamed and x.startswith(f"{key}:"):
                x, renamed = f"{sub}:{x[len(key) + 1:]}", True
            body.append(f"  {x}" if x else x)
        by_section.setdefault(section, []).append(body)
    out: list[str] = []
    written: set[str] = set()
    for key, block in blocks:
        if key is not None and key in HOME and not _is_section(key, block):
            section = HOME[key].split(".")[0]
            if section not in written:
                written.add(section)
                out.append(f"{section}:")
                for body in by_section[section]:
                    out.extend(body)
            continue
        out.extend(block)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _is_section(key: str, block: list[str]) -> bool:
    """Whether `block` already writes `key` as a section (a mapping), not an old flat value."""
    if key not in SECTIONS:
        return False
    value = next(x for x in block if x.startswith(f"{key}:"))[len(key) + 1:].split("#")[0].strip()
    return value == "" or value.startswith("{")


if __name__ == "__main__":
    # python -m taurl.recipe.sections FILE...: rewrite flat config files in place
    import sys

    for name in sys.argv[1:]:
        with open(name) as f:
            new = rewrite_in_sections(f.read())
        with open(name, "w") as f:
            f.write(new)
