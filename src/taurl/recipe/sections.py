"""The training config file in sections: where each option lives in YAML.

    env: search-v0
    policy:   {model: "", size: tiny}
    rollout:  {max_turns: 3, max_action_tokens: 48, temperature: 1.0, concurrency: 64}
    engine:   {kind: local, options: {}}
    sft:      {data: expert, demos: 12000, epochs: 2, lr: 3.0e-3}
    rl:       {updates: 30, group_size: 8, estimator: grpo, lr: 5.0e-4}
    schedule: {kind: sync, staleness_eta: 1}
    train:    {strategy: single, world_size: 1}
    eval:     {tasks: 100, trials: 3, temperature: 1.0, seed: 1234}

Each section names the options of one stage of the loop; `SECTIONS` maps ``section.key``
to the option's name in `taurl.recipe.config.TrainConfig` (one set of defaults: the
dataclass's). The flat keys of earlier files (``lr: 5.0e-4``, ``eval_tasks: 100``) still load
for one release, each with a warning naming its new place (``rl.lr``, ``eval.tasks``);
command-line flags and keyword overrides (``--lr``, ``taurl.train(..., lr=...)``) keep their
flat names. Options not listed here (``seed``, ``env``, ``imports``, ``env_config``,
``system_prompt``, ``tasks``, ``task_options``, ``alarms``, ``trackers``, ``promotion``,
``agent``, ``torch_threads``, ``reward``) stay at the top level.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import typing
from typing import Any

from taurl.errors import ConfigError

log = logging.getLogger("taurl.recipe.config")

SECTIONS: dict[str, dict[str, str]] = {
    "policy": {"model": "model", "size": "model_size", "tokenizer_texts": "tokenizer_texts",
               "vocab_size": "vocab_size", "chat_template": "chat_template", "warmup_options": "warmup_options",
               "lora": "lora", "device": "device", "torch_dtype": "torch_dtype"},
    "rollout": {k: k for k in ("max_turns", "max_action_tokens", "max_episode_tokens", "max_observation_tokens",
                               "max_context", "max_tool_calls", "temperature", "concurrency",
                               "deterministic", "generate_timeout_s", "backend", "backend_options", "compaction")},
    "engine": {"kind": "engine", "options": "engine_options"},
    "sft": {"data": "sft", "file": "sft_data", "demos": "demos", "expert_options": "expert_options",
            "epochs": "sft_epochs", "batch_size": "sft_batch_size", "lr": "sft_lr",
            "warmup_steps": "sft_warmup_steps", "max_steps": "sft_max_steps", "max_seconds": "sft_max_seconds",
            "rejection": "rejection"},
    "rl": {"updates": "updates", "tasks_per_update": "tasks_per_update", "group_size": "group_size",
           "seed": "rl_seed", "max_seconds": "rl_max_seconds", "keep_checkpoints": "keep_checkpoints",
           "checkpoint_every": "checkpoint_every",
           **{k: k for k in ("estimator", "estimator_options", "critic_lr", "vf_clip", "critic_epochs",
                             "critic_warmup_updates", "step_scorer", "step_scorer_options", "replay", "curriculum",
                             "objective", "objective_options", "eps_low", "eps_high", "aggregation",
                             "segment_weighting", "lr",
                             "lr_warmup_steps", "weight_decay", "grad_clip", "kl_coef", "kl_kind", "entropy_coef",
                             "drop_zero_variance", "micro_batch_tokens", "epochs", "dpo", "teacher",
                             "distill")},
           "tis": "tis", "tis_cap": "tis_cap"},
    "schedule": {"kind": "schedule", "staleness_eta": "staleness_eta", "overprovision": "overprovision",
                 "interrupt": "interrupt", "mask_stale": "mask_stale"},
    "train": {"strategy": "train_strategy", "world_size": "train_world_size",
              "launcher": "train_launcher", "ray": "train_ray",
              "precision": "precision", "activation_checkpointing": "activation_checkpointing",
              "attention": "attention"},
    "eval": {"tasks": "eval_tasks", "trials": "eval_trials", "temperature": "eval_temperature", "seed": "eval_seed"},
}
# the options that stay at the top level (every TrainConfig option is here or in a section)
TOP = frozenset({"seed", "env", "imports", "env_config", "system_prompt", "tasks", "task_options", "alarms",
                 "trackers", "promotion", "agent", "torch_threads",
                 "reward"})
HOME: dict[str, str] = {flat: f"{section}.{key}" for section, keys in SECTIONS.items() for key, flat in keys.items()}


def section(cfg: Any, name: str) -> Any:
    """`cfg`'s options of section `name` as that section's frozen dataclass, keyed as in the
    file: ``section(cfg, "eval").tasks`` is ``cfg.eval_tasks``. The section types are built
    from the config class's fields (`section_type`): their defaults are its defaults."""
    if name not in SECTIONS:
        raise ConfigError(f"unknown config section {name!r}; the sections are {', '.join(SECTIONS)}")
    return section_type(type(cfg), name)(**{key: getattr(cfg, flat) for key, flat in SECTIONS[name].items()})


@functools.cache
def section_type(cls: type, name: str) -> type:
    """The dataclass of section `name` of config class `cls` (TrainConfig): one field per key
    of the section, with the type and the default of the flat option it names."""
    flat = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    spec = [(key, hints[option], dataclasses.field(default=flat[option].default,
                                                    default_factory=flat[option].default_factory))
            for key, option in SECTIONS[name].items()]
    return dataclasses.make_dataclass(f"{name.title()}Section", spec, frozen=True)


def flatten(data: dict[str, Any], *, warn: bool) -> dict[str, Any]:
    """The flat options of a sectioned mapping (module docstring). A section is a mapping;
    ``sft: expert``, ``engine: vllm`` or ``schedule: async`` as a plain value is the old flat
    key. warn: say, once per key, where a flat key that has a section now lives."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    moved: list[str] = []
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, dict):
            names = SECTIONS[key]
            for sub, v in value.items():
                if sub not in names:
                    import difflib

                    close = difflib.get_close_matches(str(sub), names, n=1)
                    problems.append(f"unknown option {key}.{sub}" + (f"; did you mean {key}.{close[0]}?" if close else "")
                                    + f" ({key} holds {', '.join(names)})")
                    continue
                _put(out, names[sub], v, f"{key}.{sub}", problems)
            continue
        if warn and key in HOME:
            moved.append(f"{key} -> {HOME[key]}")
        _put(out, key, value, key, problems)
    if problems:
        raise ConfigError(problems)
    if moved:
        log.warning("flat config keys are deprecated; write them in sections: %s (they load for one more "
                    "release; `python -m taurl.recipe.sections FILE` rewrites a file)", ", ".join(moved))
    return out


def _put(out: dict[str, Any], flat: str, value: Any, written: str, problems: list[str]) -> None:
    if flat in out and out[flat] != value:
        problems.append(f"{HOME.get(flat, flat)} is given twice (in its section and as the old flat key {flat!r}, "
                        f"the second time as {written}); keep one")
    out[flat] = value


def sectioned(flat: dict[str, Any]) -> dict[str, Any]:
    """`flat` options written in sections (the form `taurl.recipe.validate.dump_config` writes):
    the top-level options first, then the sections in `SECTIONS` order."""
    out = {name: value for name, value in flat.items() if name not in HOME}
    for section, keys in SECTIONS.items():
        part = {key: flat[name] for key, name in keys.items() if name in flat}
        if part:
            out[section] = part
    return out


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


if __name__ == "__main__":  # python -m taurl.recipe.sections FILE...: rewrite flat config files in place
    import sys

    for name in sys.argv[1:]:
        with open(name) as f:
            new = rewrite_in_sections(f.read())
        with open(name, "w") as f:
            f.write(new)
