"""The public export format of the ledger: one row per trajectory, as JSONL or Parquet.

This format is a contract: `EXPORT_FIELDS` documents every field (docs/formats.md's table is
generated from it by `export_fields_markdown`), and a JSONL row is also a valid input to
`Ledger.append` — export, re-append into a fresh ledger, and you get identical
trajectories back.

A row holds the identity of the episode, its outcome, the flat token arrays the learner
uses (all of length ``num_tokens``), the counts, and the full nested record: in JSONL the
nested fields (segments, turns, messages, timings, metadata) sit at the top level of the
row, so the row is ``Trajectory.to_dict()`` plus the flat arrays and counts; in Parquet the
whole ``Trajectory.to_dict()`` is one JSON string column, ``record``.

When a dict given to `Ledger.append` carries any of the flat arrays or counts, they must
agree with its segments (`check_export_fields`): a disagreement is refused, never repaired.

The writers read from any `TrajectorySource` (a `taurl.data.ledger.Ledger` is one), so this
module does not import the ledger, and the ledger imports it for its rules.

Version 2 (from 1): `source` and `provenance` are new; `logprobs` is null for a record
no policy sampled (``source != "policy"``, e.g. an expert demonstration) — it used to be
0.0 with policy version 0, as if a policy had sampled it; `stop_reason` is any snake_case
name (the env's own reasons included), its kind given by `terminated`/`truncated`.

Version 3 (from 2): an episode is a chain of token streams (docs/long_horizons.md): the new
`stream_starts` (JSONL; in Parquet inside `record`) says where each stream after the first
begins and why, and `num_streams` counts them. The flat arrays concatenate the streams, so
for a chain they are *not* one sequence a model can read: cut them at the streams' prompt
segments (`taurl.data.chains.stream_views`). A one-stream episode (``num_streams`` 1,
``stream_starts`` empty) reads as in version 2, and version-2 rows load unchanged.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from taurl.data.trajectory import Trajectory
from taurl.errors import ContractError

EXPORT_VERSION = 3  # bump when a field changes meaning; stored in the Parquet metadata


class TrajectorySource(Protocol):
    """Where the writers read trajectories from: `taurl.data.ledger.Ledger.iter_query`."""

    def iter_query(self, **filters: Any) -> Iterator[Trajectory]: ...

# name -> "dtype: meaning". dtype is the Parquet type; JSONL uses the JSON equivalent.
EXPORT_FIELDS: dict[str, str] = {
    # identity
    "episode_id": "string: unique id of the episode (the ledger's primary key)",
    "run_id": "string: the training/eval run that produced it ('' if none)",
    "task_id": "string: the task instance",
    "group_id": "string: the group of episodes sampled for one task (GRPO group)",
    "split": "string: the task split ('train', 'holdout', ...)",
    "env_name": "string: environment id, e.g. 'search-v0'",
    "env_version": "string: environment version; changes when observation/reward meaning changes",
    "seed": "int64: the seed the environment was reset with",
    # outcome
    "reward": "float64: total reward = sum of reward_components when they are given",
    "reward_components": "string (JSON object name -> float); a JSON object in JSONL: each reward "
                         "layer separately",
    "verifier_version": "string: version of the verifier that scored the episode ('' if unscored)",
    "terminated": "bool: the task reached a terminal state (exactly one of terminated/truncated)",
    "truncated": "bool: the episode was cut off from outside (a budget, an error)",
    "stop_reason": "string: why it stopped, a snake_case name: the loop's own "
                   "(taurl.data.trajectory.StopReason) or the env's (its kind is "
                   "terminated/truncated)",
    "valid": "bool: valid-sample flag; false when an error, not the agent, ended the episode",
    "source": "string: who produced the actions: 'policy' (sampled; logprobs and versions given) "
              "or e.g. 'expert' (none)",
    "provenance": "string (JSON object); a JSON object in JSONL: what the env reported at reset "
                  "about its world (corpus fingerprint, map seed, snapshot id)",
    # flat arrays, each of length num_tokens
    "token_ids": "list<int32>: the whole token stream, segments concatenated (a chain's streams "
                 "one after the other: split them at stream_starts)",
    "action_mask": ("list<int8>: 1 on ids the policy sampled, 0 on prompt/observation/template "
                    "ids (loss_mask: which of them are trained on)"),
    "loss_mask": ("list<int8>: the ids a loss trains on: action_mask with 0 on a summary "
                  "recorded as untrained (rollout.compaction summary: masked; its turn's "
                  "action.trained is false)"),
    "logprobs": "list<float32>, null when source is not 'policy': behaviour logprob of each "
                "sampled id, 0.0 where action_mask is 0",
    "token_versions": "list<int32>: policy version that sampled each id, -1 where no policy did "
                      "(action_mask 0, or source not 'policy')",
    "policy_versions": "list<int32>: sorted distinct policy versions of the action segments",
    # counts
    "num_tokens": "int32: length of token_ids",
    "num_action_tokens": "int32: number of 1s in action_mask",
    "num_turns": "int32: number of agent turns",
    "num_tool_calls": "int32: turns with a tool receipt",
    "num_invalid_actions": "int32: turns whose action could not be parsed or was not allowed",
    "num_errors": "int32: turns with an environment or tool failure",
    "num_streams": "int32: token streams in the episode's chain (1 unless the context was "
                   "compacted or history rewritten)",
    # the nested record
    "segments": "JSONL only, list of {kind, token_ids, logprobs, policy_version}: the token stream "
                "by segment (logprobs/policy_version null off actions and when source is not "
                "'policy')",
    "turns": "JSONL only, list of Turn objects: action/observation text, parsed action, tool "
             "receipt, timings",
    "messages": "JSONL only, list of chat messages: the chat the token stream renders",
    "stream_starts": "JSONL only, list of {segment, message, reason}: where each token stream "
                     "after the first begins (its prompt segment, its first message) and why "
                     "('compaction', 'template_rewrite', 'agent_rewrite')",
    "timings": "JSONL only, object name -> seconds",
    "metadata": "JSONL only, object: free-form, JSON-able",
    "record": "Parquet only, string: JSON of the full Trajectory.to_dict() (Trajectory.from_dict "
              "rebuilds it)",
}

FLAT_ARRAYS = ("token_ids", "action_mask", "loss_mask", "logprobs", "token_versions")
COUNTS = ("num_tokens", "num_action_tokens", "num_turns", "num_tool_calls",
          "num_invalid_actions", "num_errors", "num_streams")
_JSONL_ONLY = ("segments", "turns", "messages", "stream_starts", "timings", "metadata")
_LOGPROB_TOL = 1e-6  # relative: float32 rounding (2**-24 ≈ 6e-8) passes, a different value does not


def export_fields_markdown() -> str:
    """`EXPORT_FIELDS` as a Markdown table (docs/formats.md is generated with it)."""
    lines = ["| field | dtype | meaning |", "|---|---|---|"]
    for name, doc in EXPORT_FIELDS.items():
        dtype, _, meaning = doc.partition(": ")
        lines.append(f"| `{name}` | {dtype} | {meaning} |")
    return "\n".join(lines)


def export_row(traj: Trajectory) -> dict[str, Any]:
    """The JSONL row of `traj`: identity, outcome, flat arrays, counts, nested record."""
    d = traj.to_dict()
    row: dict[str, Any] = {k: d[k] for k in (
        "episode_id", "run_id", "task_id", "group_id", "split", "env_name", "env_version", "seed",
        "reward", "reward_components", "verifier_version", "terminated", "truncated",
        "stop_reason")}
    row.update(valid=traj.valid, source=d["source"], provenance=d["provenance"])
    # no behaviour policy, no behaviour logprobs: null, never a placeholder that reads as one
    logprobs = traj.logprobs if traj.has_behaviour_policy else None
    row.update(token_ids=traj.token_ids, action_mask=traj.action_mask, loss_mask=loss_mask(traj),
               logprobs=logprobs, token_versions=traj.token_versions,
               policy_versions=traj.policy_versions)
    row.update({k: getattr(traj, k) for k in COUNTS if k != "num_turns"}, num_turns=len(traj.turns))
    row.update({k: d[k] for k in _JSONL_ONLY})
    return _jsonable(row)


def loss_mask(traj: Trajectory) -> list[int]:
    """`traj.action_mask` with 0 on the ids of every turn recorded as untrained
    (``action["trained"] is False``: a compaction summary kept off the loss). What SFT and
    the learners train on (`taurl.train.chains.untrained_keep`), so an export does not call
    a masked summary trained."""
    mask = traj.action_mask
    starts = [0]
    for seg in traj.segments:
        starts.append(starts[-1] + len(seg.token_ids))
    for t in traj.turns:
        if t.action.get("trained") is False:
            a, b = starts[t.action_segment], starts[t.action_segment + 1]
            mask[a:b] = [0] * (b - a)
    return mask


def _jsonable(x: Any) -> Any:
    # asdict keeps tuples; rows hold lists so that a row equals its JSON round trip
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


# ---------------------------------------------------------------------------------------
# Checking the flat form of a dict given to Ledger.append


def _ints_equal(got: list, want: list[int]) -> int | None:
    """Index of the first element of `got` that is not exactly the int in `want`, or None."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if type(g) is not int or g != w:
            return i
    return None


def _floats_close(got: list, want: list[float]) -> int | None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if (type(g) not in (int, float) or not math.isfinite(g)
                or not math.isclose(g, w, rel_tol=_LOGPROB_TOL, abs_tol=_LOGPROB_TOL)):
            return i
    return None


def check_export_fields(d: dict[str, Any], traj: Trajectory) -> list[ContractError]:
    """Rules that the flat arrays and counts of `d`, when present, agree with `traj`.

    `traj` is ``Trajectory.from_dict(d)`` and already keeps the trajectory contracts.
    Rules: flat_length_mismatch, mask_mismatch, flat_values_mismatch, derived_mismatch.
    """
    flat = {k: d[k] for k in FLAT_ARRAYS if k in d}
    if "logprobs" in flat and (flat["logprobs"] is None) != (not traj.has_behaviour_policy):
        want = "null (no policy sampled its actions)" if not traj.has_behaviour_policy else "a list"
        return [ContractError("flat_values_mismatch", "logprobs is "
                                                      f"{type(flat['logprobs']).__name__} but the "
                              f"record's source is {traj.source!r}, so it must be {want}")]
    if flat.get("logprobs", ()) is None:
        del flat["logprobs"]
    for k, v in flat.items():
        if not isinstance(v, list):
            return [ContractError("schema", f"flat field {k!r} must be a list, got "
                                            f"{type(v).__name__}")]
    n = traj.num_tokens
    lengths = {k: len(v) for k, v in flat.items()}
    if any(n_k != n for n_k in lengths.values()):
        # element checks mean nothing when positions do not line up
        return [ContractError("flat_length_mismatch",
                              f"flat arrays have lengths {lengths} but the segments hold {n} "
                              "tokens; write them from the same segments "
                              "(taurl.data.export.export_row) or leave them out")]
    errs: list[ContractError] = []
    if ("action_mask" in flat
        and (i := _ints_equal(flat["action_mask"], traj.action_mask)) is not None):
        errs.append(ContractError("mask_mismatch",
                                  f"action_mask[{i}] is {flat['action_mask'][i]!r} but the segment "
                                  f"kinds give {traj.action_mask[i]}; the mask must be 1 exactly "
                                  "on action tokens"))
    if "loss_mask" in flat and (i := _ints_equal(flat["loss_mask"], loss_mask(traj))) is not None:
        errs.append(ContractError(
            "mask_mismatch", f"loss_mask[{i}] is {flat['loss_mask'][i]!r} but the record gives "
            f"{loss_mask(traj)[i]}: action_mask with 0 on turns recorded as untrained"))
    checks = (("token_ids", _ints_equal, traj.token_ids),
              ("token_versions", _ints_equal, traj.token_versions),
              ("logprobs", _floats_close, traj.logprobs))
    for k, cmp, want in checks:
        if k in flat and (i := cmp(flat[k], want)) is not None:
            errs.append(ContractError("flat_values_mismatch",
                                      f"{k}[{i}] is {flat[k][i]!r} but the segments give "
                                      f"{want[i]!r}"))
    want_derived: dict[str, Any] = {k: getattr(traj, k) for k in COUNTS if k != "num_turns"}
    want_derived.update(num_turns=len(traj.turns), valid=traj.valid,
                        policy_versions=traj.policy_versions)
    for k, want in want_derived.items():
        if k in d and (type(d[k]) is not type(want) or d[k] != want
                       or (isinstance(want, list) and _ints_equal(d[k], want) is not None)):
            errs.append(ContractError("derived_mismatch",
                                      f"{k} is {d[k]!r} but the record gives {want!r}"))
    return errs


# ---------------------------------------------------------------------------------------
# Writers and readers


def _atomic_path(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    dest = Path(path)
    return dest, dest.with_name(dest.name + ".tmp")


def export_jsonl(ledger: TrajectorySource, path: str | os.PathLike[str], **query: Any) -> int:
    """Write the trajectories `ledger.query(**query)` selects to `path` as JSONL.

    Rows are in insertion order; the file is replaced atomically. Returns the row count.
    """
    dest, tmp = _atomic_path(path)
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for traj in ledger.iter_query(**query):
            f.write(json.dumps(export_row(traj), ensure_ascii=False, allow_nan=False) + "\n")
            n += 1
    os.replace(tmp, dest)
    return n


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a JSONL export (blank lines skipped)."""
    rows = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ContractError("schema", f"{path}:{lineno}: not a JSON line ({e})") from None
            rows.append(row)
    return rows


def parquet_schema() -> Any:
    """The pyarrow schema of the Parquet export."""
    import pyarrow as pa  # imported here: the ledger itself needs only the stdlib

    s, i32 = pa.string(), pa.int32()
    fields = [(k, s) for k in ("episode_id", "run_id", "task_id", "group_id", "split", "env_name",
                               "env_version")]
    fields += [("seed", pa.int64()), ("reward", pa.float64()), ("reward_components", s),
               ("verifier_version", s), ("terminated", pa.bool_()), ("truncated", pa.bool_()),
               ("stop_reason", s), ("valid", pa.bool_()), ("source", s), ("provenance", s),
               ("token_ids", pa.list_(i32)), ("action_mask", pa.list_(pa.int8())),
               ("loss_mask", pa.list_(pa.int8())),
               ("logprobs", pa.list_(pa.float32())), ("token_versions", pa.list_(i32)),
               ("policy_versions", pa.list_(i32))]
    fields += [(k, i32) for k in COUNTS] + [("record", s)]
    return pa.schema(fields, metadata={"taurl.export_version": str(EXPORT_VERSION)})


def _parquet_rows(trajs: Iterator[Trajectory]) -> Iterator[dict[str, Any]]:
    for traj in trajs:
        row = export_row(traj)
        for k in _JSONL_ONLY:  # they live in `record`
            del row[k]
        row["reward_components"] = json.dumps(row["reward_components"], allow_nan=False)
        row["provenance"] = json.dumps(row["provenance"], ensure_ascii=False, allow_nan=False)
        row["record"] = json.dumps(_jsonable(traj.to_dict()), ensure_ascii=False, allow_nan=False)
        yield row


def export_parquet(ledger: TrajectorySource, path: str | os.PathLike[str], batch_size: int = 512,
                   **query: Any) -> int:
    """Write the trajectories `ledger.query(**query)` selects to `path` as Parquet.

    Written in row groups of `batch_size`; the file is replaced atomically. Returns the
    row count.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema()
    dest, tmp = _atomic_path(path)
    n, batch = 0, []
    with pq.ParquetWriter(tmp, schema) as writer:
        for row in _parquet_rows(ledger.iter_query(**query)):
            batch.append(row)
            if len(batch) >= batch_size:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                n, batch = n + len(batch), []
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            n += len(batch)
    os.replace(tmp, dest)
    return n
