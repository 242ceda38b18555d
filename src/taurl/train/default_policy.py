"""The default policy of an env: a tokenizer trained on training-split text and a tiny
model built from scratch (`taurl.policy.model.build_default_policy`).

Which texts: the env's `tokenizer_texts` hook when it has one (search-v0: its corpus minus
held-out subjects, training questions, the system prompt); otherwise a generic collection
from the training split only — the system prompt, the tool declarations, the training
tasks' prompts, and, when the env has an expert, the expert's actions and the observations
they produce (the env is stepped directly, no model involved). Validation and holdout text
never reaches the tokenizer.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from taurl.data.task import Task

if TYPE_CHECKING:  # types only: the trainer reads an env through its spec, never imports one
    from taurl.envs.core import Env
    from taurl.envs.spec import EnvSpec

# expert episodes stepped for tokenizer text (enough for every word to recur)
GENERIC_EXPERT_TASKS = 2000


def default_policy_texts(spec: EnvSpec, make_env: Any, train_tasks: Sequence[Task], *,
                         task_options: dict[str, Any], expert_options: dict[str, Any],
                         seed: int) -> list[str]:
    """Tokenizer training texts for env `spec` (module docstring)."""
    env: Env = make_env()
    hooks = spec.policy_hooks
    if hasattr(hooks, "tokenizer_texts"):
        return list(hooks.tokenizer_texts(env, train_tasks, **task_options))
    texts = (
        [env.system_prompt] * 10 + [json.dumps(env.tools)] * 10 + [t.prompt for t in train_tasks]
    )
    if spec.expert is None:
        return texts
    rng = random.Random(seed)
    for task in list(train_tasks)[:GENERIC_EXPERT_TASKS]:
        env = make_env()
        obs, _ = env.reset(task, seed=rng.getrandbits(31))
        texts.append(obs)
        for action in spec.expert(task, rng, **expert_options):
            texts.append(action)
            obs, _, terminated, truncated, _ = env.step(action)
            texts.append(obs)
            if terminated or truncated:
                break
    return [t for t in texts if t]
