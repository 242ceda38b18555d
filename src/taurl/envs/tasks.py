"""Where a run's tasks come from: the env's registered task source, or a JSONL file.

A task file has one JSON object per line (the `Task` record):

    {"task_id": "q1", "prompt": "What is 2+3?", "answers": ["5"], "split": "train",
     "metadata": {"hops": 1}}

``split`` is "train", "validation" or "holdout"; ``answers`` a list of gold strings (may
be empty when the env's verifier decides from state); ``metadata`` is optional and passed
to the env untouched. A bad row is reported with its line number and left out; the rest
are kept, and every problem is counted (`TaskFile.problems`). Duplicate ``task_id``s are
bad rows too: an id names one task in the ledger and in the evaluation.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taurl import envs
from taurl.envs.core import Task
from taurl.errors import ConfigError, Error

SPLITS = ("train", "validation", "holdout")


@dataclass(frozen=True)
class TaskFile:
    """The tasks of a JSONL file, by split, and what was wrong with the rows left out."""

    path: str
    by_split: dict[str, list[Task]]
    problems: list[str] = field(default_factory=list)


def _row_problem(row: Any) -> str | None:
    if not isinstance(row, dict):
        return "is not a JSON object"
    for key, kind in (("task_id", str), ("prompt", str), ("split", str)):
        if not isinstance(row.get(key), kind) or not row.get(key):
            return f"needs a non-empty string {key!r}"
    if row["split"] not in SPLITS:
        return f"split {row['split']!r} is not one of {SPLITS}"
    answers = row.get("answers", [])
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        return "'answers' must be a list of strings"
    if not isinstance(row.get("metadata", {}), dict):
        return "'metadata' must be an object"
    unknown = set(row) - {"task_id", "prompt", "answers", "split", "metadata", "env"}
    if unknown:
        return f"has unknown keys {sorted(unknown)} (put extra fields under 'metadata')"
    return None


def read_task_file(path: str | Path, env: str) -> TaskFile:
    """Parse `path` (module docstring); raises only when the file cannot be read at all."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise Error(f"cannot read task file {path}: {e}") from None
    by_split: dict[str, list[Task]] = {s: [] for s in SPLITS}
    problems, seen = [], set()
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{path}:{no}: not JSON ({e.msg})")
            continue
        if why := _row_problem(row):
            problems.append(f"{path}:{no}: row {why}")
            continue
        if row["task_id"] in seen:
            problems.append(f"{path}:{no}: duplicate task_id {row['task_id']!r}")
            continue
        seen.add(row["task_id"])
        by_split[row["split"]].append(Task(task_id=row["task_id"], prompt=row["prompt"],
                                           answers=tuple(row.get("answers", [])),
                                           split=row["split"],
                                           env=env, metadata=dict(row.get("metadata", {}))))
    return TaskFile(str(path), by_split, problems)


@dataclass(frozen=True)
class TaskPlan:
    """The run's tasks: demonstration tasks, the RL pool, validation and holdout.

    demos and rl are disjoint slices of one shuffled list of training tasks, so RL is
    never rewarded for recalling a demonstration. validation chooses settings; holdout is
    only ever reported.
    """

    demos: list[Task]
    rl: list[Task]
    validation: list[Task]
    holdout: list[Task]
    skipped_rows: int = 0


def plan_tasks(env: str, *, task_file: str, task_options: dict[str, Any], n_demos: int, n_rl: int,
               n_eval: int, seed: int, eval_seed: int,
               env_config: dict[str, Any] | None = None) -> TaskPlan:
    """Draw the plan from the task file (when given) or the env's task source (which gets
    `env_config` too when it asks for it: `taurl.envs.registry.make_tasks`)."""
    if task_file:
        tf = read_task_file(task_file, env)
        pools = {s: list(ts) for s, ts in tf.by_split.items()}
        random.Random(seed).shuffle(pools["train"])
        for s in ("validation", "holdout"):
            random.Random(eval_seed).shuffle(pools[s])
        train, validation, holdout = (pools["train"], pools["validation"][:n_eval],
                                      pools["holdout"][:n_eval])
        skipped = len(tf.problems)
    else:
        source = {"env_config": env_config, **task_options}
        train = envs.make_tasks(env, "train", n=n_demos + n_rl, seed=seed, **source)
        validation = envs.make_tasks(env, "validation", n=n_eval, seed=eval_seed, **source)
        holdout = envs.make_tasks(env, "holdout", n=n_eval, seed=eval_seed, **source)
        skipped = 0
    problems = []
    if len(train) < n_demos + n_rl:
        problems.append(f"{len(train)} training tasks, but demos + updates x tasks_per_update "
                        f"needs {n_demos + n_rl}: lower them, or give more tasks")
    for name, ts in (("validation", validation), ("holdout", holdout)):
        if not ts:
            problems.append(f"no {name} tasks: the task source (or file) must provide a {name!r} "
                            "split")
    if problems:
        raise ConfigError(problems)
    leaked = {t.task_id for t in train} & {t.task_id for t in validation + holdout}
    if leaked:
        raise Error(f"{len(leaked)} task id(s) are in training and in validation/holdout (e.g. "
                    f"{sorted(leaked)[0]!r}); the splits must be disjoint")
    return TaskPlan(demos=train[:n_demos], rl=train[n_demos:n_demos + n_rl], validation=validation,
                    holdout=holdout, skipped_rows=skipped)
