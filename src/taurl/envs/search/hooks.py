"""search-v0's preparation of the default (from-scratch) policy: the recipe's policy hooks.

* `tokenizer_texts`: the BPE tokenizer is trained on the corpus documents of training
  entities, the training questions and the system prompt. Documents of validation and
  holdout subjects are left out (with ``split_by: country`` every entity of a held-out
  task; with ``split_by: city`` the held-out cities, since countries are answer classes
  both splits share), so no held-out name shapes the vocabulary.
* `warmup`: the copy warm-up (`taurl.train.copy_warmup`): a model built from scratch has
  no induction heads, and ~300 steps of copying the demonstration tasks' subjects and
  answers form them before SFT (docs/experiments/speed.md, "Copy warm-up": holdout query copy 0.04
  without, 0.93 with). Copy accuracy is measured on subjects of RL tasks, which the warm-up never
  saw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from taurl.envs.core import Env, Task


class SearchPolicyHooks:
    """The `taurl.envs.spec.PolicyHooks` of search-v0 (module docstring)."""

    def tokenizer_texts(self, env: Env, train_tasks: Sequence[Task], split_by: str = "country",
                        families: Any = None) -> list[str]:
        from taurl.envs.search.corpus import build_corpus
        from taurl.envs.search.questions import generate_tasks

        held: set[str] = set()
        for split in ("validation", "holdout"):
            for t in generate_tasks(split, split_by=split_by):
                held.add(t.metadata["subject_id"])
                if split_by == "country":
                    held.update(t.metadata["entities"])
        texts = [d.text for d in build_corpus() if d.doc_id not in held]
        texts += [t.prompt for t in generate_tasks("train", split_by=split_by)]
        return texts + [env.system_prompt] * 50

    def warmup(self, model: Any, tokenizer: Any, train_tasks: Sequence[Task], *, seed: int,
               lr: float,
               grad_clip: float, log: Callable[[int, dict[str, float]], None], steps: int = 300,
               batch_size: int = 64, probe_tasks: Sequence[Task] = (),
               copy_phase: Callable[..., dict[str, float]]) -> dict[str, float]:
        """`steps` of the copy warm-up on the names of `train_tasks` (the demonstration tasks);
        returns the exact-copy rate of names in `probe_tasks` the warm-up never saw.
        `copy_phase` is the trainer's copy phase (`taurl.train.copy_warmup`), passed in by
        the recipe: an env names what to copy, the training stage (above the envs) trains it."""
        names = [t.metadata["subject"] for t in train_tasks] + [t.answers[0] for t in train_tasks
                                                                if t.answers]
        probe = [t.metadata["subject"] for t in probe_tasks]
        return copy_phase(model, tokenizer, names, probe, steps=steps, batch_size=batch_size, lr=lr,
                          grad_clip=grad_clip, seed=seed, log=log)
