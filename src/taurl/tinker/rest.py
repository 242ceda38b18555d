"""The REST listing of training runs and checkpoints (the SDK's ``tinker.RestClient``).

    GET /api/v1/training_runs?limit=&offset=          list_training_runs
    GET /api/v1/training_runs/{model id}              get_training_run(_by_tinker_path)
    GET /api/v1/training_runs/{model id}/checkpoints  list_checkpoints
    GET /api/v1/checkpoints?limit=&offset=            list_user_checkpoints (newest first)

A training run is a training client (its model id): every client still open on the server
and every one whose checkpoints are on disk (``RUN/tinker/<model>/``, so runs of an earlier
server on the same run directory are listed too). A checkpoint's ``checkpoint_id`` is
``weights/<name>`` or ``sampler_weights/<name>``, as the SDK parses a ``tinker://`` path; its
time is when it was written; nothing expires and nothing is public. The answers are the
SDK's own response models, so a field the SDK reads is there in the shape it expects.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from taurl.tinker.checkpoints import KINDS, CheckpointPath
from taurl.tinker.models import UnknownId

OWNER = "local"  # `TrainingRun.model_owner`: the server has no users


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds")  # sorts as text


def _checkpoint(directory: Path, meta: dict[str, Any], kind: str) -> dict[str, Any]:
    cp = CheckpointPath(meta["model_id"], kind, directory.name)
    return {"checkpoint_id": f"{kind}/{directory.name}", "checkpoint_type": KINDS[kind],
            "time": _iso((directory / "tinker.json").stat().st_mtime), "tinker_path": cp.uri,
            "size_bytes": sum(f.stat().st_size for f in directory.iterdir() if f.is_file()),
            "public": False, "expires_at": None}


def _on_disk(run_dir: Path) -> dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]:
    """{model id: [(checkpoint, its tinker.json)]} of every whole checkpoint under RUN/tinker."""
    out: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for meta_file in sorted((run_dir / "tinker").glob("*/*/*/tinker.json")):
        directory = meta_file.parent
        kind = directory.parent.name
        if kind not in KINDS or directory.name.startswith("."):  # a save in progress
            continue
        meta = json.loads(meta_file.read_text())
        out.setdefault(meta["model_id"], []).append((_checkpoint(directory, meta, kind), meta))
    for cps in out.values():
        cps.sort(key=lambda c: c[0]["time"])
    return out


def checkpoints(run_dir: Path, model_id: str, live: dict[str, Any]) -> dict[str, Any]:
    """``CheckpointsListResponse`` of one training run (oldest first)."""
    found = _on_disk(run_dir)
    if model_id not in found and model_id not in live:
        raise UnknownId(f"no training run {model_id!r} on this server")
    return {"checkpoints": [c for c, _ in found.get(model_id, [])], "cursor": None}


def _run(model_id: str, cps: list[tuple[dict[str, Any], dict[str, Any]]], model: Any) -> dict:
    def last(kind: str) -> dict[str, Any] | None:
        of_kind = [c for c, _ in cps if c["checkpoint_type"] == kind]
        return of_kind[-1] if of_kind else None

    if model is not None:
        base, rank = model.base.name, model.lora.rank
        when = _iso(datetime.now(UTC).timestamp())  # a client still open: now
    else:
        meta = cps[-1][1]
        base, rank, when = meta["base_model"], meta["lora"]["rank"], cps[-1][0]["time"]
    return {"training_run_id": model_id, "base_model": base, "model_owner": OWNER,
            "is_lora": True, "lora_rank": rank, "corrupted": False, "last_request_time": when,
            "last_checkpoint": last("training"), "last_sampler_checkpoint": last("sampler"),
            "user_metadata": None}


def training_run(run_dir: Path, model_id: str, live: dict[str, Any]) -> dict[str, Any]:
    """``TrainingRun`` of one model id."""
    cps = _on_disk(run_dir).get(model_id, [])
    if not cps and model_id not in live:
        raise UnknownId(f"no training run {model_id!r} on this server")
    return _run(model_id, cps, live.get(model_id))


def training_runs(run_dir: Path, live: dict[str, Any], limit: int, offset: int
                  ) -> dict[str, Any]:
    """``TrainingRunsResponse``: the runs, newest request first, one page of them."""
    found = _on_disk(run_dir)
    runs = [_run(mid, found.get(mid, []), live.get(mid)) for mid in set(found) | set(live)]
    runs.sort(key=lambda r: (r["last_request_time"], r["training_run_id"]), reverse=True)
    return {"training_runs": runs[offset:offset + limit],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)}}


def user_checkpoints(run_dir: Path, limit: int, offset: int) -> dict[str, Any]:
    """``CheckpointsListResponse`` of every run's checkpoints, newest first, one page."""
    every = [c for cps in _on_disk(run_dir).values() for c, _ in cps]
    every.sort(key=lambda c: c["time"], reverse=True)
    return {"checkpoints": every[offset:offset + limit],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(every)}}
