"""Resume is exact or refused: a run directory holds one run.

A resumed run reuses what its directory holds — checkpoints, stored episodes (by id), the
evaluations — so it must be the run that wrote them. At every start the recipe records the
run's identity in ``state.json``: its configuration (and a digest of it), the env's name,
version and verifier version, and a fingerprint of the model it started from. A later
start in the same directory must match it, except for the options in `RESUMABLE` (budgets
and bookkeeping that change how long the run goes on or what it keeps, not what any stored
record means). Anything else is refused before any file is written, with the changed keys
and how to start a new run instead; otherwise, e.g., a resume with ``--eval-trials 5`` over a
3-trial evaluation would pair 0-5 success counts with 0-3 ones.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from taurl.errors import Error
from taurl.recipe.sections import flat_options, flatten, homes
from taurl.recipe.typed import is_record, option_class, record_value

# options a resume may change: how far the run goes and what it keeps, not what a record means
# (deterministic, like device and torch_threads, changes how later rows are computed, not what a
# stored one is)
RESUMABLE = ("updates", "rl_max_seconds", "sft_max_seconds", "keep_checkpoints", "trackers",
             "torch_threads", "generate_timeout_s", "device", "deterministic",
             "train_strategy", "train_world_size",
             "launcher", "ray")  # where the step runs, not what it is (train.launcher, train.ray)


class ResumeError(Error, ValueError):
    """A run directory holds a run with another configuration, env or model."""


def run_identity(cfg: Any, env: Any) -> dict[str, Any]:
    """What the run is: its configuration outside `RESUMABLE` (with a digest), its env and model."""
    # under the flat names of the release before sections, so a run of that release resumes
    config = json.loads(json.dumps({k: v for k, v in flat_options(cfg).items()
                                    if k not in RESUMABLE}, default=str))
    return {"config_digest": _digest(config), "config": config,
            "env": {"name": env.name, "version": str(env.version),
                    "verifier_version": str(getattr(env, "verifier_version", ""))},
            "model": model_fingerprint(cfg.model) if cfg.model else "default"}


def model_fingerprint(path: str | Path) -> str:
    """A digest of a model directory: its config files whole, and each weight file's size and
    first and last MiB (cheap on a large model, and it changes when the weights do)."""
    h = hashlib.sha256()
    root = Path(path).expanduser()
    if not root.exists():
        # a named model (smollm2-135m-instruct, a hub id): its name is its identity, the
        # registry package or hub revision pins the weights; converting it here would be costly
        return "name:" + str(path)
    files = [root] if root.is_file() else sorted(p for p in root.iterdir() if p.is_file())
    for f in files:
        h.update(f.name.encode())
        size = f.stat().st_size
        h.update(str(size).encode())
        with f.open("rb") as fh:
            if f.suffix in (".json", ".txt", ".model") or size <= 2 << 20:
                h.update(fh.read())
            else:
                h.update(fh.read(1 << 20))
                fh.seek(size - (1 << 20))
                h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def check_resume(run_dir: str | Path, identity: dict[str, Any]) -> None:
    """Raise ResumeError when `run_dir` holds a run whose identity differs from `identity`
    outside `RESUMABLE` (nothing is written); a new or empty directory passes."""
    root = Path(run_dir)
    stored = _stored_identity(root)
    if stored is None:
        return
    changed = [(k, old, identity["config"].get(k))
               for k, old in sorted(stored.get("config", {}).items())
               if k in identity["config"] and not _same_option(k, old, identity["config"][k])]
    for k, old in (stored.get("env") or {}).items():
        if identity["env"].get(k) != old:
            changed.append((f"env.{k}", old, identity["env"].get(k)))
    if "model" in stored and stored["model"] != identity["model"]:
        changed.append(("model (its files)", stored["model"], identity["model"]))
    if not changed:
        return
    what = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in changed)
    raise ResumeError(
        f"{root} holds a run with another configuration, so it cannot be resumed with this one "
        f"(changed: {what}). A resumed run reuses its stored checkpoints, episodes and "
        f"evaluations, so only {', '.join(RESUMABLE)} may change. Resume with the run's own "
        f"values, or start a new run with these: give another --run-dir")


def _stored_identity(root: Path) -> dict[str, Any] | None:
    """The identity the run recorded; for a run from before it was recorded, its config.yaml."""
    state = root / "state.json"
    if state.exists():
        recorded = json.loads(state.read_text()).get("identity")
        if recorded is not None:
            return recorded
    if state.exists() and (root / "config.yaml").exists():
        # in sections since the config file has them; a run from before, flat
        # (taurl.recipe.sections)
        config = flatten(yaml.safe_load((root / "config.yaml").read_text()) or {}, warn=False)
        return {"config": {k: v for k, v in json.loads(json.dumps(config, default=str)).items()
                           if k not in RESUMABLE}}
    return None


def typed_classes() -> dict[str, type]:
    """The option class of each typed option of `TrainConfig`, by its flat name (the names
    a run's identity records)."""
    import dataclasses

    from taurl.recipe.config import TrainConfig
    from taurl.recipe.options import SECTION_TYPES, section_fields

    flat_of = {home: flat for flat, home in homes().items()}
    out = {f.name: option_class(f) for f in dataclasses.fields(TrainConfig) if is_record(f)}
    for name in SECTION_TYPES:
        out.update({flat_of.get(f"{name}.{f.name}", f"{name}.{f.name}"): option_class(f)
                    for f in section_fields(name) if is_record(f)})
    return out  # type: ignore[return-value]


def _same_option(name: str, old: Any, new: Any) -> bool:
    """Whether a stored option equals this run's; a typed option (`promotion`, `compaction`,
    ...) is compared as its record, so a run that wrote its defaults out (``promotion:
    {margin: 0.0, ...}``, recorded so before typed options) resumes with ``{}``."""
    cls = typed_classes().get(name)
    if old == new or cls is None or not (isinstance(old, dict) and isinstance(new, dict)):
        return old == new
    try:
        return record_value(cls, old) == record_value(cls, new)
    except TypeError:  # a key the class no longer has
        return False


def _digest(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def eval_mismatch(stored: dict[str, Any], version: int, trials: int, temperature: float, seed: int,
                  task_ids: list[str]) -> list[str]:
    """The fields in which a stored evaluation (evals/<tag>.json) is not the one asked for:
    an evaluation is reused only when it is the same policy version on the same tasks, trials,
    seed and temperature (a file from before a field was recorded is not checked on it)."""
    asked = {"policy_version": version, "trials": trials, "temperature": temperature,
             "eval_seed": seed}
    out = [k for k, v in asked.items() if stored.get(k) is not None and stored[k] != v]
    if "task_successes" in stored and sorted(stored["task_successes"]) != sorted(task_ids):
        out.append("tasks")
    return out


def eval_tag(tag: str, mismatch: list[str], version: int, trials: int, temperature: float,
             seed: int, task_ids: list[str]) -> str:
    """The episode tag of a new evaluation where a stored one does not match: its episodes get
    ids of their own, so none of the stored evaluation's is reused for it."""
    if mismatch == ["policy_version"]:  # the run was extended (more updates) after this evaluation
        return f"{tag}-v{version}"
    asked = {"v": version, "k": trials, "t": temperature, "s": seed, "tasks": task_ids}
    return f"{tag}-{_digest(asked)[:8]}"
