"""code-v0's preparation of the default (from-scratch) policy: the recipe's policy hooks.

`tokenizer_texts`: the BPE tokenizer is trained on training-split text only — the system
prompt and tool declarations (weighted, they open every episode), the training prompts,
the expert's actions for every training task (reference and planted-bug drafts, built on
the host, no sandbox), and the observations of `OBSERVED_TASKS` expert episodes stepped
through the env (write receipts, passing and failing test reports, verdicts). Stepping
is what costs (≈0.3 s of sandbox runs per episode), so only a sample is stepped: the
generic routine would step up to 2,000 episodes (≈10 minutes).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from taurl.envs.code.expert import expert
from taurl.envs.core import Env, Task

OBSERVED_TASKS = 48  # expert episodes stepped for observation text (every report line recurs)
PREFIX_WEIGHT = 50  # copies of the system prompt and tool declarations


class CodePolicyHooks:
    """The `taurl.envs.spec.PolicyHooks` of code-v0 (module docstring)."""

    def tokenizer_texts(self, env: Env, train_tasks: Sequence[Task], families: Any = None) -> list[str]:
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
