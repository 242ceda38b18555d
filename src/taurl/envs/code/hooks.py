"""code-v0's preparation of the default (from-scratch) policy: the recipe's policy hooks.

`tokenizer_texts`: the BPE tokenizer is trained on training-split text only — the system
prompt and tool declarations (weighted, they open every episode), the training prompts,
the expert's actions for every training task (reference and planted-bug drafts, built on
the host, no sandbox), and the observations of `OBSERVED_TASKS` expert episodes stepped
through the env (write receipts, passing and failing test reports, verdicts). Stepping
is what costs (≈0.3 s of sandbox runs per episode), so only a sample is stepped: the
generic routine would step up to 2,000 episodes (≈10 minutes).

`warmup`: the copy warm-up of search-v0 (`taurl.train.copy_warmup`) on code-v0's strings:
a policy built from scratch has no induction heads, and every solution copies the
prompt's constants (``a=3, b=-4`` → ``3 * x + -4``). The strings copied are the lines of
the training tasks' reference solutions that hold a constant, and their parameter values;
accuracy is measured on lines of RL tasks the warm-up never saw.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from taurl.envs.code.expert import expert
from taurl.envs.code.tasks import reference_source
from taurl.envs.core import Env, Task

OBSERVED_TASKS = 48  # expert episodes stepped for observation text (every report line recurs)
PREFIX_WEIGHT = 50  # copies of the system prompt and tool declarations


class CodePolicyHooks:
    """The `taurl.envs.spec.PolicyHooks` of code-v0 (module docstring)."""

    def tokenizer_texts(self, env: Env, train_tasks: Sequence[Task],
                        families: Any = None) -> list[str]:
        texts = [env.system_prompt, json.dumps(env.tools)] * PREFIX_WEIGHT
        rng = random.Random(0)
        for task in train_tasks:
            texts.append(task.prompt)
            texts += expert(task, rng, p_bug=0.5)
        for i, task in enumerate(list(train_tasks)[:OBSERVED_TASKS]):
            env.reset(task, seed=i)
            for action in expert(task, random.Random(i), p_bug=1.0 if i % 2 else 0.0):
                obs, _, terminated, truncated, _ = env.step(action)
                texts.append(obs)
                if terminated or truncated:
                    break
        env.close()
        return [t for t in texts if t]

    def warmup(self, model: Any, tokenizer: Any, train_tasks: Sequence[Task], *, seed: int,
               lr: float,
               grad_clip: float, log: Callable[[int, dict[str, float]], None], steps: int = 0,
               batch_size: int = 64, probe_tasks: Sequence[Task] = (),
               copy_phase: Callable[..., dict[str, float]]) -> dict[str, float]:
        """`steps` of copying (module docstring; 0 skips it); returns the exact-copy rate of
        strings of `probe_tasks` the warm-up never saw. `copy_phase` is the trainer's copy
        phase (`taurl.train.copy_warmup.copy_warmup_phase`), passed in by the recipe: an env
        names what to copy, the training stage (above the envs) trains it."""
        names = [n for t in train_tasks for n in copy_strings(t)]
        probe = [n for t in probe_tasks for n in copy_strings(t)]
        return copy_phase(model, tokenizer, names, probe, steps=steps, batch_size=batch_size, lr=lr,
                          grad_clip=grad_clip, seed=seed, log=log)


def copy_strings(task: Task) -> list[str]:
    """What a solution of `task` copies: its reference lines holding a constant, and the
    parameter values (JSON text)."""
    lines = [ln.strip() for ln in reference_source(task).splitlines()]
    out = [ln for ln in lines if 4 <= len(ln) <= 80 and any(c.isdigit() or c in "'\"" for c in ln)]
    return out + [json.dumps(list(task.metadata["params"].values()))]
