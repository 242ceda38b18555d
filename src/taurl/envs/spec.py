"""What an environment registers beside its factory: the optional plug points of the recipe.

    register("frozenlake-v0", FrozenLakeEnv, tasks=frozenlake_tasks, expert=bfs_expert,
             verifier=FrozenLakeVerifier, policy_hooks=None)

Each piece is a small protocol; an env that leaves one out simply lacks that feature
(no expert: SFT data must come from a trajectory file or rejection sampling; no verifier:
the evaluator scores a record by its terminal outcome reward; no policy hooks: the default
policy's tokenizer is trained on texts the generic routine collects, see
`taurl.train.default_policy.default_policy_texts`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from taurl.envs.core import Env, Task


class TaskSource(Protocol):
    """``tasks(split, n, seed, **options) -> list[Task]``: `n` tasks of `split`
    ("train" | "validation" | "holdout"), deterministic in `seed`. The three splits must be
    disjoint in whatever the env considers an instance (a map, an entity, a problem)."""

    def __call__(self, split: str, n: int, seed: int = 0, **options: Any) -> list[Task]: ...


class Expert(Protocol):
    """``expert(task, rng, **options) -> action strings``, one per turn, as the policy should
    write them. `options` are the expert's quality knobs (the config's ``expert_options``),
    e.g. search-v0's ``p_skip_search``: an expert degraded on purpose leaves RL a better
    strategy to find. The actions are played through the real agent loop, so a demonstration
    is token-for-token what the policy would have produced."""

    def __call__(self, task: Task, rng: random.Random, **options: Any) -> list[str]: ...


@runtime_checkable
class Verifier(Protocol):
    """The evaluator's own scorer of a finished record: 1.0 success, 0.0 failure (partial
    credit allowed in between). It re-derives the outcome from the record (the final
    answer, the final state, hidden tests) and never trusts the training reward.
    `version` changes whenever the verdict on some record would change."""

    version: str

    def __call__(self, traj: Any, task: Task) -> float: ...


class PolicyHooks(Protocol):
    """Env-specific preparation of the default (from-scratch) policy. Both are optional
    methods; the recipe calls those an object has.

    tokenizer_texts(env, train_tasks, **task_options) -> list[str]: texts the default BPE
        tokenizer is trained on (training split only: held-out text must stay unseen).
    warmup(model, tokenizer, train_tasks, *, seed, lr, grad_clip, log, probe_tasks,
           copy_phase, **options) -> dict[str, float]: a pre-SFT warm-up (search-v0's copy
        warm-up) on the demonstration tasks, with the config's ``warmup_options``; returns
        metrics. ``copy_phase`` is the trainer's copy phase
        (`taurl.train.copy_warmup.copy_warmup_phase`), passed in by the recipe so that an
        env never imports the training stage above it.
    """


@dataclass(frozen=True)
class EnvSpec:
    """One registered environment and its optional plug points (module docstring)."""

    name: str
    # (a "module:attr" string until `registry.spec` imports it; so the others)
    factory: Callable[..., Env]
    tasks: TaskSource | None = None
    expert: Expert | None = None
    verifier: Callable[[], Verifier] | None = None  # makes a fresh instance per evaluation
    policy_hooks: Any = None  # a PolicyHooks object (duck-typed: any subset of its methods)
    # the expert in the proxy's wire format (tool calls): ``(task, rng, **options) -> [reply, ...]``
    # one reply per model call, for agents trained through `taurl.proxy` (their demonstrations)
    tool_expert: Expert | None = None
    source: str = "taurl"  # who registered it: taurl, a module name, or an entry point

    def make_verifier(self) -> Verifier | None:
        return self.verifier() if self.verifier is not None else None
