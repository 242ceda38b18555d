"""Estimators by name, for the config: ``compute_advantages(batch, "gigpo", omega=1.0)``.

Every estimator is a pure function ``(batch: TurnBatch, **hyperparameters) -> Credit``.
Unknown names and unknown hyperparameters raise one ConfigError that lists every problem,
with "did you mean" hints.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from taurl.credit.batch import Credit, TurnBatch
from taurl.credit.gae import gae_turns
from taurl.credit.gigpo import gigpo
from taurl.credit.graph import salt
from taurl.credit.multiagent import RoleBaselineEstimator, proposer_solver, zero_sum
from taurl.credit.outcome import (
    discounted_turn_returns,
    dr_grpo,
    grpo,
    grpo_batch_std,
    orm,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)
from taurl.credit.prm import istar
from taurl.credit.segments import segment_grpo
from taurl.errors import ConfigError

Estimator = Callable[..., Credit]
T = TypeVar("T")

ESTIMATORS: dict[str, Estimator] = {
    "returns": discounted_turn_returns,
    "orm": orm,
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "grpo_batch_std": grpo_batch_std,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "gae": gae_turns,
    "gigpo": gigpo,
    "segment_grpo": segment_grpo,
    "salt": salt,
    "istar": istar,  # GRPO + the learned step scorer's step term (taurl.credit.prm)
    # several agents in one episode (taurl.credit.multiagent, docs/multi-agent.md)
    "zero_sum": zero_sum,
    "proposer_solver": proposer_solver,
    # a class: an estimator with state between updates (running per-role baselines);
    # `make_estimator` builds one instance with the options
    "rae": RoleBaselineEstimator,
}

# estimators that read a learned value function: the learner trains a critic for them
# (`taurl.train.critic`) and fills ``batch.values`` / ``batch.bootstrap_values``
NEEDS_VALUES = frozenset({"gae"})


def did_you_mean(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
    return f" Did you mean {', '.join(map(repr, close))}?" if close else ""


def lookup(table: Mapping[str, T], name: str, what: str) -> T:
    """``table[name]``, or a ConfigError naming the closest registered names."""
    if name not in table:
        raise ConfigError(f"unknown {what} {name!r}.{did_you_mean(name, list(table))} "
                          f"Registered: {', '.join(sorted(table))}")
    return table[name]


def check_config(fn: Callable[..., Any], config: Mapping[str, Any], what: str,
                 positional: int) -> None:
    """Raise one ConfigError listing every key of `config` that `fn` does not take.

    positional: how many leading parameters are data (the batch, tensors), not config.
    """
    params = list(inspect.signature(fn).parameters)[positional:]
    problems = [f"{what} has no option {k!r}.{did_you_mean(k, params)} Options: "
                f"{', '.join(params) or 'none'}"
                for k in config if k not in params]
    if problems:
        raise ConfigError(problems)


def estimator_names() -> list[str]:
    return sorted(ESTIMATORS)


def get_estimator(name: str) -> Estimator:
    """The estimator function registered under `name`."""
    return lookup(ESTIMATORS, name, "advantage estimator")


def make_estimator(name: str, **config: Any) -> Callable[[TurnBatch], Credit]:
    """`name`'s estimator with its hyperparameters bound, checked once, here."""
    fn = get_estimator(name)
    if isinstance(fn, type):  # a stateful estimator: its constructor takes the options
        check_config(fn, config, f"estimator {name!r}", positional=0)
        return fn(**config)
    check_config(fn, config, f"estimator {name!r}", positional=1)
    return functools.partial(fn, **config)


def compute_advantages(batch: TurnBatch, name: str, **config: Any) -> Credit:
    """Run estimator `name` on `batch` with hyperparameters `config`."""
    return make_estimator(name, **config)(batch)


def needs_values(name: str) -> bool:
    """True when estimator `name` reads ``batch.values`` (the learner must run a critic)."""
    return name in NEEDS_VALUES


def probe_batch() -> TurnBatch:
    """A tiny batch of every shape an estimator meets (2 groups of 2, 1–2 turns, a truncation)."""
    import numpy as np

    b = TurnBatch.build([1.0, 0.0, 0.0, 0.0], ["a", "a", "b", "b"], num_turns=[2, 1, 2, 2],
                        step_rewards=[[0.0, 0.0], [0.0, 0.0], [0.1, 0.0], [0.0, 0.0]],
                        state_hash=[[1, 2], [1, 0], [1, 3], [1, 3]],
                        truncated=[False, False, True, False],
                        values=np.zeros((4, 2)), bootstrap_values=np.zeros(4))
    return b.replace(state_text=(("s", "t"), ("s",), ("s", "u"), ("s", "u")))


def estimator_problems(name: str, config: Mapping[str, Any]) -> list[str]:
    """Every reason `name` with `config` cannot run, found before any work.

    Checks the name and the option names (`make_estimator`), then runs the estimator once on
    `probe_batch`, so an option *value* that only the estimator's body rejects (a gamma of
    1.5, an unknown mode) is reported at config time, not after SFT.
    """
    try:
        fn = make_estimator(name, **config)
    except ConfigError as e:
        return e.problems
    try:
        fn(probe_batch())
    except ConfigError as e:
        return [f"estimator {name!r}: {p}" for p in e.problems]
    except (ValueError, TypeError) as e:
        return [f"estimator {name!r} cannot run with options {dict(config)}: {e}"]
    return []
