"""reasoning-gym's task families as taurl tasks: the dataset by name, splits by content,
`score_answer` as the verifier, and an expert that writes the gold answer.

    env_config = {"dataset": "letter_counting", "min_words": 3, "max_words": 6}
    tasks = rg_tasks("holdout", 100, seed=1234, env_config=env_config)

``dataset`` is any name in ``reasoning_gym.factory.DATASETS`` (an unknown name is an error
that lists the close ones and the count of all); every other key of `env_config` that is
not the adapter's own (`ADAPTER_KEYS`) is an option of that dataset's config dataclass,
checked by field name before any work. ``seed`` and ``size`` are the adapter's to choose.

Splits. reasoning-gym draws item ``i`` of a dataset from ``Random(seed + i)``, so two seeds
can yield the same question (small families repeat often). A split chosen by seed would
leak; instead each instance is keyed by its content (question and gold answer) and the
key's hash picks its split (`taurl.envs.gym.splits.split_of`, 80/10/10): an instance
belongs to one split whatever seed drew it, and within one call each instance is drawn
at most once (one cluster of the evaluation's interval). The task id is the content hash,
so the recipe's leak check sees a repeat too.

Each task keeps the reasoning-gym entry (``metadata["entry"]``: question, answer and the
family's own metadata, which its `score_answer` reads) and its provenance (package,
version, dataset, options, the dataset seed and item index it came from).
"""

from __future__ import annotations

import difflib
import functools
import json
import random
from importlib.metadata import version as package_version
from typing import Any

from taurl.envs.core import Task
from taurl.envs.gym.splits import content_hash, derive_seed, split_of
from taurl.errors import ConfigError

NAME = "reasoning-gym-v0"  # the env's (and its tasks') name; registered as ``reasoning-gym``
PACKAGE = "reasoning-gym"
FRACTIONS = (0.8, 0.1, 0.1)
ADAPTER_KEYS = ("dataset", "tools", "max_turns", "python_timeout_s")  # the env's own options
RESERVED = ("seed", "size")  # chosen by the adapter: the split draw's seed and stream length
DRAWS_PER_TASK = 40  # a holdout instance is 1 in 10 of the stream; repeats cost more draws


def rg_version() -> str:
    return package_version(PACKAGE)


def _datasets() -> dict[str, Any]:
    try:
        import reasoning_gym  # noqa: F401  (importing it registers every family)
        from reasoning_gym.factory import DATASETS
    except ImportError as e:
        raise ConfigError(f"env reasoning-gym needs the reasoning-gym package ({e}); "
                          "pip install 'taurl[ecosystem]' (or pip install reasoning-gym)") from e
    return DATASETS


def dataset_options(env_config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(the dataset name, its config options) from `env_config`; every problem at once."""
    datasets = _datasets()
    name = env_config.get("dataset")
    if not isinstance(name, str) or not name:
        raise ConfigError("env reasoning-gym needs env_config 'dataset', a reasoning-gym task "
                          "family, e.g. --env-config '{\"dataset\": \"letter_counting\"}'; "
                          f"families: {', '.join(sorted(datasets))}")
    if name not in datasets:
        close = difflib.get_close_matches(name, list(datasets), n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise ConfigError(f"reasoning-gym has no dataset {name!r}; {hint}it has {len(datasets)}: "
                          f"{', '.join(sorted(datasets))}")
    options = {k: v for k, v in env_config.items() if k not in ADAPTER_KEYS}
    fields = sorted(getattr(datasets[name][1], "__dataclass_fields__", {}))
    problems = [f"env_config {k!r}: the adapter chooses the dataset's {k} (the split draw); drop it"
                for k in sorted(set(options) & set(RESERVED))]
    for k in sorted(set(options) - set(fields) - set(RESERVED)):
        close = difflib.get_close_matches(k, fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"env_config {k!r} is not an option of reasoning-gym dataset "
                        f"{name!r}{hint}; its options: "
                        f"{', '.join(f for f in fields if f not in RESERVED)}; the adapter's: "
                        f"{', '.join(ADAPTER_KEYS)}")
    if problems:
        raise ConfigError(problems)
    return name, options


@functools.lru_cache(maxsize=64)
def _dataset(name: str, options_json: str, seed: int, size: int) -> Any:
    from reasoning_gym import create_dataset

    try:  # (some families generate all `size` items up front, some cap it: the draw's own length)
        return create_dataset(name, seed=seed, size=size, **json.loads(options_json))
    except (TypeError, ValueError, AssertionError) as e:  # the family's own validate()
        raise ConfigError(f"reasoning-gym dataset {name!r} refused its options "
                          f"{json.loads(options_json)}: {type(e).__name__}: {e}") from e


def dataset(name: str, options: dict[str, Any], seed: int = 0, size: int = 1000) -> Any:
    """The reasoning-gym dataset object (cached; its `score_answer` is the verifier)."""
    return _dataset(name, json.dumps(options, sort_keys=True), seed, size)


def instance_key(entry: dict[str, Any]) -> str:
    return json.dumps([entry["question"], str(entry["answer"])])


def rg_tasks(split: str, n: int, seed: int = 0, *,
             env_config: dict[str, Any] | None = None) -> list[Task]:
    """`n` distinct tasks of `split` (module docstring), deterministic in `seed`."""
    if split not in ("train", "validation", "holdout"):
        raise ConfigError(f"split {split!r} is unknown; use train, validation or holdout")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"n must be an integer >= 0, got {n!r}")
    name, options = dataset_options(env_config or {})
    ds_seed = derive_seed(NAME, name, seed)  # one stream per seed; the content decides the split
    max_draws = DRAWS_PER_TASK * n + 1000
    ds = dataset(name, options, ds_seed, max_draws)
    out: list[Task] = []
    seen: set[str] = set()
    answers: list[str] = []  # the stream's gold answers so far: the decoys of a degraded expert
    index = -1
    for index in range(max_draws):
        if len(out) >= n:
            break
        entry = ds[index]
        key = instance_key(entry)
        answers.append(str(entry["answer"]))
        if split_of(key, FRACTIONS) != split or key in seen:
            continue
        seen.add(key)
        out.append(_task(name, options, (ds_seed, max_draws, index), entry, key, split, answers))
    if len(out) < n:
        raise ConfigError(f"reasoning-gym dataset {name!r} with options {options} gave {len(out)} "
                          f"distinct {split} instances in {index + 1} draws, not {n}: its instance "
                          "space is too small for that many; ask for fewer (eval.tasks, demos, "
                          "updates) or widen its options")
    return out


def _task(name: str, options: dict[str, Any], where: tuple[int, int, int], entry: dict[str, Any],
          key: str, split: str, answers: list[str]) -> Task:
    gold = str(entry["answer"])
    rng = random.Random(derive_seed("decoy", key))
    decoys = [a for a in answers[-200:] if a != gold]
    provenance = {"package": PACKAGE, "version": rg_version(), "env_id": name, "options": options,
                  "seed": where[0], "size": where[1], "index": where[2]}
    return Task(task_id=f"{name}-{content_hash(key)}", prompt=str(entry["question"]),
                answers=(gold,), split=split, env=NAME,
                metadata={"entry": entry, "provenance": provenance,
                          "decoy": rng.choice(decoys) if decoys else ""})


def score(task: Task, answer: str | None) -> float:
    """reasoning-gym's own `score_answer` of `answer` for `task` (a family that raises on a
    malformed answer scores it 0.0: the answer was wrong, not the env)."""
    prov = task.metadata["provenance"]
    ds = dataset(prov["env_id"], prov["options"], prov["seed"], prov["size"])
    try:
        return float(ds.score_answer(answer, task.metadata["entry"]))
    except Exception:  # noqa: BLE001 — a family's scorer choking on an answer is a wrong answer
        return 0.0


class RGVerifier:
    """The evaluator's scorer: `score_answer` of the record's final answer, recomputed from
    the record (never its reward). Partial credit as the family gives it."""

    name = "reasoning-gym/score_answer"

    def __init__(self) -> None:
        self.version = f"reasoning-gym {rg_version()} score_answer"
        self.calls = 0

    def __call__(self, traj: Any, task: Task) -> float:
        self.calls += 1
        if traj.task_id != task.task_id or not traj.turns or not traj.terminated:
            return 0.0
        last = traj.turns[-1].action
        return score(task, str(last["answer"])) if last.get("kind") == "answer" else 0.0


def rg_expert(task: Task, rng: random.Random, p_correct: float = 1.0) -> list[str]:
    """The gold answer as one action; with probability 1 - `p_correct` another instance's
    answer instead (a degraded expert leaves RL a better policy to find)."""
    if not 0.0 <= p_correct <= 1.0:
        raise ConfigError(f"expert option p_correct must be in [0, 1], got {p_correct!r}")
    right = rng.random() < p_correct or not task.metadata.get("decoy")
    return [f"<answer>{task.answers[0] if right else task.metadata['decoy']}</answer>"]
