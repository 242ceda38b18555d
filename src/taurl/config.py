"""Typed run configurations: loaded from YAML, validated once, all problems reported together.

Each field's comment is its documentation; `taurl rollout --help` and the README list them.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from taurl.errors import ConfigError, UnknownEnvError


@dataclass(frozen=True)
class RolloutRunConfig:
    """`taurl rollout`: run episodes of an environment with a policy and store them."""

    env: str = "search-v0"  # registered environment name (taurl.envs.registered())
    env_config: dict[str, Any] = field(default_factory=dict)  # keyword arguments for the env
    model: str = ""  # a local Hugging Face model directory; "" builds the default tiny policy
    model_size: str = "tiny"  # preset of the default policy when model == "": tiny | small
    split: str = "train"  # task split to sample: train | holdout
    task_options: dict[str, Any] = field(default_factory=dict)  # the env's task-source options (search-v0: families, split_by)
    episodes: int = 64  # number of episodes (tasks x group_size)
    group_size: int = 1  # episodes per task (G, for group-relative credit)
    concurrency: int = 32  # episodes in flight at once (the engine batches them)
    seed: int = 0  # seeds task sampling, the default policy and sampling
    temperature: float = 1.0  # sampling temperature (0 = greedy)
    top_p: float = 1.0  # nucleus sampling mass
    max_turns: int = 4  # actions per episode
    max_action_tokens: int = 96  # sampled tokens per action
    max_episode_tokens: int = 384  # sampled tokens per episode
    max_observation_tokens: int = 256  # observation cut, in tokens
    max_context: int = 1536  # prompt + actions + observations
    max_tool_calls: int | None = None  # tool calls per episode (null: no budget)

    def rollout_config(self):
        from taurl.rollout import RolloutConfig

        return RolloutConfig(max_turns=self.max_turns, max_action_tokens=self.max_action_tokens,
                             max_episode_tokens=self.max_episode_tokens,
                             max_observation_tokens=self.max_observation_tokens, max_context=self.max_context,
                             max_tool_calls=self.max_tool_calls, temperature=self.temperature, top_p=self.top_p)

    def problems(self) -> list[str]:
        out = []
        for name in ("episodes", "group_size", "concurrency", "max_turns", "max_action_tokens",
                     "max_episode_tokens", "max_observation_tokens", "max_context"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.temperature < 0:
            out.append(f"temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            out.append(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.task_options:
            from taurl.envs.registry import task_option_problems

            try:
                out += task_option_problems(self.env, self.task_options)
            except UnknownEnvError as e:
                out.append(str(e))
        if self.model_size not in ("tiny", "small"):
            out.append(f"model_size must be 'tiny' or 'small' (got {self.model_size!r})")
        if self.model and not (Path(self.model) / "config.json").exists():
            out.append(f"model {self.model!r} is not a local Hugging Face model directory (no config.json)")
        return out


def load_config(cls: type, data: dict[str, Any] | None = None, path: str | Path | None = None,
                overrides: dict[str, Any] | None = None):
    """Build `cls` from a YAML file, a dict and overrides (later wins); validate everything.

    Unknown keys (with a "did you mean"), wrong types and out-of-range values are all
    collected and raised together as one ConfigError.
    """
    merged: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping of option: value")
        merged.update(loaded)
    merged.update(data or {})
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    problems = []
    for key in list(merged):
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            problems.append(f"unknown option {key!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
            merged.pop(key)
        elif not _type_ok(merged[key], hints[key]):
            problems.append(f"{key} must be {_type_name(hints[key])} (got {merged[key]!r})")
            merged.pop(key)
    if problems:
        raise ConfigError(problems)
    cfg = cls(**merged)
    if hasattr(cfg, "problems") and (more := cfg.problems()):
        raise ConfigError(more)
    return cfg


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    return isinstance(value, hint) if isinstance(hint, type) else True


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def dump_config(cfg: Any) -> str:
    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)
