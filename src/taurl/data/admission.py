"""What may enter the ledger: its tables, its rules, and the check every record passes.

`admit(item)` turns whatever a caller gave (a `Trajectory` or its dict form, maybe with the
export's flat arrays) into a checked Trajectory and its canonical JSON, or raises the
ContractError of the first rule it breaks (`RULES` names them all). The SQL schema, the
append-only triggers and the row a record is stored as live here too, so `taurl.data.ledger`
holds only the store.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from typing import Any

from taurl.data.export import EXPORT_FIELDS, check_export_fields
from taurl.data.trajectory import Trajectory, check_trajectory
from taurl.errors import ContractError

SCHEMA_VERSION = 1
_COLUMNS = ("episode_id", "seq", "run_id", "task_id", "group_id", "split", "env_name",
            "env_version",
            "min_version", "max_version", "reward", "terminated", "truncated", "stop_reason",
            "num_tokens", "num_action_tokens", "num_turns", "valid", "created_at", "record")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS trajectories (
    episode_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,          -- insertion order, 1, 2, 3, ...
    run_id TEXT NOT NULL, task_id TEXT NOT NULL, group_id TEXT NOT NULL, split TEXT NOT NULL,
    env_name TEXT NOT NULL, env_version TEXT NOT NULL,
    min_version INTEGER, max_version INTEGER,   -- policy versions of the action segments
    reward REAL NOT NULL, terminated INTEGER NOT NULL, truncated INTEGER NOT NULL,
    stop_reason TEXT NOT NULL, num_tokens INTEGER NOT NULL, num_action_tokens INTEGER NOT NULL,
    num_turns INTEGER NOT NULL, valid INTEGER NOT NULL, created_at REAL NOT NULL,
    record TEXT NOT NULL                  -- Trajectory.to_dict() as JSON
);
CREATE INDEX IF NOT EXISTS trajectories_run ON trajectories(run_id, seq);
CREATE INDEX IF NOT EXISTS trajectories_task ON trajectories(task_id);
CREATE INDEX IF NOT EXISTS trajectories_group ON trajectories(group_id);
CREATE INDEX IF NOT EXISTS trajectories_split ON trajectories(split);
CREATE INDEX IF NOT EXISTS trajectories_env ON trajectories(env_name);
CREATE INDEX IF NOT EXISTS trajectories_min_version ON trajectories(min_version);
CREATE INDEX IF NOT EXISTS trajectories_max_version ON trajectories(max_version);
CREATE TABLE IF NOT EXISTS rejections (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, created_at REAL NOT NULL,
    episode_id TEXT, run_id TEXT, rule TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rejections_run ON rejections(run_id);
"""
# BEFORE INSERT also stops INSERT OR REPLACE, whose implicit delete fires no DELETE trigger.
_TRIGGERS = """
CREATE TRIGGER IF NOT EXISTS {t}_no_update BEFORE UPDATE ON {t}
BEGIN SELECT RAISE(ABORT, 'taurl ledger is append-only: {t} rows cannot be updated'); END;
CREATE TRIGGER IF NOT EXISTS {t}_no_delete BEFORE DELETE ON {t}
BEGIN SELECT RAISE(ABORT, 'taurl ledger is append-only: {t} rows cannot be deleted'); END;
CREATE TRIGGER IF NOT EXISTS {t}_no_replace BEFORE INSERT ON {t}
WHEN EXISTS (SELECT 1 FROM {t} WHERE {key} = NEW.{key}) \
OR EXISTS (SELECT 1 FROM {t} WHERE seq = NEW.seq)
BEGIN SELECT RAISE(ABORT, 'taurl ledger is append-only: a stored row cannot be replaced'); END;
"""
# Every rule a refused append can name (ContractError.rule), with its meaning.
RULES: dict[str, str] = {
    # structure (taurl.data.trajectory.from_dict) and storage
    "schema": "not a Trajectory or its dict form: a missing field, a wrong type, an unknown field",
    "not_json": "a value JSON cannot hold exactly: NaN/Infinity, a non-string key, a numpy scalar, "
                "a lone surrogate",
    # the trajectory contracts (taurl.data.trajectory.check_trajectory)
    "missing_identity": "episode_id, task_id, group_id, split, env_name or env_version is empty",
    "seed_range": "the seed is not an integer that fits in int64",
    "empty_trajectory": "no segments",
    "prompt_first": "the first segment is not the prompt",
    "segment_kind": "a segment kind outside prompt/action/observation/template",
    "empty_segment": "a non-action segment without tokens",
    "token_range": "a token id that is not an integer in [0, 2**31)",
    "logprobs_length": "an action segment of a policy-sampled record whose logprobs are missing or "
                       "not one per token id",
    "logprob_range": "a behaviour logprob that is not finite or is > 0",
    "action_without_version": "an action segment of a policy-sampled record without the policy "
                              "version that sampled it",
    "behaviour_without_policy": "an action segment of a record no policy sampled (source not "
                                "'policy', e.g. 'expert') carrying logprobs or a policy version",
    "source_name": "source is not 'policy' or another snake_case name",
    "version_range": "a policy version that is not an integer in [0, 2**31)",
    "non_action_logprobs": "logprobs or a policy version on a prompt/observation/template segment",
    "stream_start": "a later token stream of a chain that does not start at a prompt segment after "
                    "the previous one, a reason that is not snake_case, or a prompt segment that "
                    "starts no stream",
    "turn_segment": "a turn whose action/observation segment index points at the wrong kind",
    "missing_stop_reason": "no stop_reason",
    "stop_reason_name": "stop_reason is not a snake_case name",
    "termination_flags": "terminated/truncated not exactly one true, or the opposite of the kind "
                         "of one of the loop's own stop reasons",
    "reward_finite": "the reward is NaN or infinite",
    "reward_components_sum": "the reward components do not sum to the reward",
    "missing_verifier_version": "reward components without the verifier version",
    # the ledger's own
    "duplicate_episode": "the episode_id is already stored (or repeated within one batch)",
    "flat_length_mismatch": "flat token_ids/action_mask/logprobs/token_versions disagree in length "
                            "with the segments",
    "mask_mismatch": "the flat action_mask is not 1 exactly on the action segments' tokens",
    "flat_values_mismatch": "flat token_ids/logprobs/token_versions differ from the segments'",
    "derived_mismatch": "a count, valid or policy_versions differs from what the record gives",
}
# keys a dict given to `append` may have: the record's fields and the export's extras
_KNOWN_KEYS = (frozenset(f.name for f in fields(Trajectory))
               | (frozenset(EXPORT_FIELDS) - {"record"}))



_INT_KINDS = frozenset({int, bool})
_NUM_KINDS = frozenset({int, bool, float})


def _json_problem(x: Any, finite: bool, where: str = "record") -> str | None:
    """Why `x` cannot be stored as JSON and read back identical, or None.

    finite=False lets NaN/Infinity pass, so that the rules that name them (reward_finite,
    logprob_range) speak first; the stored form is checked again with finite=True.
    """
    if x is None or isinstance(x, (bool, int)):
        return None
    if isinstance(x, float):
        return (None if math.isfinite(x) or not finite else f"{where} is {x}; JSON has no "
                                                            "NaN/Infinity")
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return f"{where} holds a lone surrogate; text must be valid Unicode"
        return None
    if isinstance(x, (list, tuple)):
        # fast path for the common case (token ids, logprobs): exact ints/bools/floats, checked
        # in C; anything else, or a non-finite float, takes the element walk and its message
        kinds = set(map(type, x))
        if kinds <= _INT_KINDS or (kinds <= _NUM_KINDS
                                   and (not finite or all(map(math.isfinite, x)))):
            return None
        return next((p for i, v in enumerate(x)
                     if (p := _json_problem(v, finite, f"{where}[{i}]"))), None)
    if isinstance(x, dict):
        for k, v in x.items():
            if not isinstance(k, str):
                return f"{where} has key {k!r} of type {type(k).__name__}; JSON keys are strings"
            if p := _json_problem(k, finite,
                                  f"{where} key") or _json_problem(v, finite, f"{where}[{k!r}]"):
                return p
        return None
    return (f"{where} is a {type(x).__name__}; only str, int, float, bool, None, list and dict "
            "are stored (convert numpy scalars with int()/float())")


def _admit(item: Any) -> tuple[Trajectory, str]:
    """Check `item` against every rule; return the trajectory and its canonical JSON."""
    is_dict = isinstance(item, dict)
    if isinstance(item, Trajectory):
        try:
            d: Any = item.to_dict()
        except RecursionError:
            raise  # reported as not_json, like a deep dict
        except Exception as e:
            # asdict deep-copies whatever the fields hold; any failure is the record's
            raise ContractError("schema", "the Trajectory's fields have the wrong types "
                                          f"({type(e).__name__}: {e})") from None
    elif is_dict:
        d = item
        unknown = sorted(repr(k) for k in d if k not in _KNOWN_KEYS)
        if unknown:
            raise ContractError("schema", f"unknown field(s) {', '.join(unknown)[:400]}; a record "
                                          "has the fields of "
                                "Trajectory.to_dict() and, optionally, those of "
                                "taurl.data.export.EXPORT_FIELDS")
    else:
        raise ContractError("schema", "append takes a Trajectory or its dict form (to_dict() or "
                                      "an exported "
                            f"JSONL row), got {type(item).__name__}")
    # the JSON round trip sends Trajectory input through from_dict's type checks too
    norm = _json_round_trip(d)
    traj = Trajectory.from_dict(norm)
    errs = check_trajectory(traj)
    if not errs and is_dict:
        errs = check_export_fields(norm, traj)
    if errs:
        also = "; ".join(str(e) for e in errs[1:])
        raise ContractError(errs[0].rule, errs[0].detail + (f" (also: {also})" if also else ""))
    stored = traj.to_dict()
    if problem := _json_problem(stored, finite=True):  # e.g. a NaN timing
        raise ContractError("not_json", problem)
    return traj, json.dumps(stored, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _json_round_trip(d: Any) -> Any:
    try:
        problem = _json_problem(d, finite=False)
        if not problem:
            return json.loads(json.dumps(d))
    except (RecursionError, ValueError) as e:  # too deep; an int past Python's digit limit
        problem = f"the record cannot be written as JSON ({type(e).__name__}: {e})"
    raise ContractError("not_json", problem)


def _ident(item: Any, key: str) -> str | None:
    """`item`'s episode_id/run_id for the rejections table, if it has a readable one."""
    v = (getattr(item, key, None) if isinstance(item, Trajectory)
         else item.get(key) if isinstance(item, dict) else None)
    return _safe_text(v) if isinstance(v, str) else None


def _safe_text(s: str) -> str:
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _row(traj: Trajectory, record: str, now: float) -> tuple:
    versions = traj.policy_versions
    return (traj.episode_id, traj.run_id, traj.task_id, traj.group_id, traj.split, traj.env_name,
            traj.env_version, versions[0] if versions else None, versions[-1] if versions else None,
            traj.reward, int(traj.terminated), int(traj.truncated), traj.stop_reason.value,
            traj.num_tokens, traj.num_action_tokens, len(traj.turns), int(traj.valid), now, record)


_INSERT = (f"INSERT INTO trajectories ({', '.join(c for c in _COLUMNS if c != 'seq')}, seq) "
           f"VALUES ({', '.join('?' * (len(_COLUMNS) - 1))}, "
           "(SELECT COALESCE(MAX(seq), 0) + 1 FROM trajectories))")
