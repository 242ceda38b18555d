"""Objectives by name, for the config: ``make_objective("gspo", eps_low=3e-4)``.

Three families, by the data they take (the leading positional tensors):

* policy_gradient — ``fn(logprobs, old_logprobs, advantages, mask, **cfg)``
  ("ppo", "dual_clip_ppo", "gspo", "decoupled_ppo"; the last one also needs the keyword
  tensor ``behaviour_logprobs``);
* sft — ``fn(logprobs, mask, **cfg)`` ("sft");
* preference — ``fn(chosen_logprobs, chosen_ref, chosen_mask, rejected_logprobs,
  rejected_ref, rejected_mask, **cfg)`` ("dpo").

Each returns ``(loss, metrics)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taurl.credit.registry import check_config, lookup
from taurl.errors import ConfigError
from taurl.train.objectives.dpo import dpo_loss
from taurl.train.objectives.gspo import gspo_loss
from taurl.train.objectives.offpolicy import decoupled_ppo_loss, is_options_problems
from taurl.train.objectives.ppo import dual_clip_ppo_loss, ppo_clip_loss
from taurl.train.objectives.sft import sft_loss

Objective = Callable[..., Any]


@dataclass(frozen=True)
class ObjectiveSpec:
    """An objective, its family and how many leading tensors it takes before its options."""

    fn: Objective
    family: str
    positional: int
    # problems with the option values, from the config
    check: Callable[..., list[str]] | None = None


OBJECTIVES: dict[str, ObjectiveSpec] = {
    "ppo": ObjectiveSpec(ppo_clip_loss, "policy_gradient", 4),
    "dual_clip_ppo": ObjectiveSpec(dual_clip_ppo_loss, "policy_gradient", 4),
    "gspo": ObjectiveSpec(gspo_loss, "policy_gradient", 4),
    "decoupled_ppo": ObjectiveSpec(decoupled_ppo_loss, "policy_gradient", 4, is_options_problems),
    "sft": ObjectiveSpec(sft_loss, "sft", 2),
    "dpo": ObjectiveSpec(dpo_loss, "preference", 6),
}


def objective_names() -> list[str]:
    return sorted(OBJECTIVES)


def objective_family(name: str) -> str:
    """"policy_gradient", "sft" or "preference": which tensors the objective takes."""
    return lookup(OBJECTIVES, name, "objective").family


def get_objective(name: str) -> Objective:
    """The loss function registered under `name`."""
    return lookup(OBJECTIVES, name, "objective").fn


def make_objective(name: str, **config: Any) -> Objective:
    """`name`'s loss with its options bound, checked once, here (unknown keys -> ConfigError)."""
    spec = lookup(OBJECTIVES, name, "objective")
    check_config(spec.fn, config, f"objective {name!r}", positional=spec.positional)
    if spec.check is not None and (problems := spec.check(**config)):
        raise ConfigError(problems)
    return functools.partial(spec.fn, **config)
