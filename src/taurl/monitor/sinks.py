"""Optional experiment-tracking sinks: the rows of `metrics.jsonl`, also to TensorBoard and W&B.

`metrics.jsonl` stays the record (the report and the alarms read it); a sink receives
exactly the rows the `MetricsWriter` writes, at the moment it writes them:

- ``tensorboard``: event files under ``RUN/tensorboard/`` through torch's
  `torch.utils.tensorboard.SummaryWriter` (``tensorboard --logdir RUN/tensorboard``);
- ``wandb``: a W&B run in offline mode under ``RUN/wandb/offline-run-*`` (never the
  network; ``wandb sync RUN/wandb/offline-run-*`` uploads it later if you want).

Each row's numeric values become scalars named ``<phase>/<key>`` (``rl/rollout/reward_mean``,
``sft/sft/loss``, ``eval_holdout-final/eval/success``) at the row's ``step``: the phases
count their steps separately (SFT steps, RL updates, policy versions), so the phase in the
name keeps each curve's steps increasing. Both packages are the optional extra
``taurl[track]``; `tracker_problems` names a missing one with its install command before
any work.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from taurl.monitor.metrics import MetricsWriter

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # tracker name -> the module it needs
INSTALL = "pip install 'taurl[track]'  (or: pip install tensorboard wandb)"


def tracker_problems(names: list[str]) -> list[str]:
    """Unknown tracker names ("did you mean") and trackers whose package is not installed."""
    out = []
    for name in names:
        if not isinstance(name, str):
            out.append(f"trackers: each tracker is a name (got {name!r})")
        elif name not in TRACKERS:
            close = difflib.get_close_matches(name, TRACKERS, n=1)
            out.append(f"trackers: no tracker named {name!r}"
                       + (f"; did you mean {close[0]!r}?" if close
                          else f" (trackers: {', '.join(TRACKERS)})"))
        elif importlib.util.find_spec(TRACKERS[name]) is None:
            out.append(f"trackers: {name} needs the {TRACKERS[name]!r} package, which is not "
                       f"installed: {INSTALL}")
    if len(set(map(str, names))) < len(names):
        out.append(f"trackers: a tracker is named twice ({names})")
    return out


class Sink(Protocol):
    def log(self, row: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The row's numeric metrics as ``<phase>/<key>`` (step and time are its axes; the phase names
    it)."""
    phase = row.get("phase", "run")
    return {f"{phase}/{k}": float(v) for k, v in row.items()
            if k not in ("step", "time", "phase") and isinstance(v, (int, float))}


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, row: dict[str, Any]) -> None:
        for tag, v in scalars(row).items():
            self.writer.add_scalar(tag, v, global_step=int(row["step"]), walltime=row.get("time"))
        self.writer.flush()  # a killed run keeps every row written so far

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, root: Path, name: str, config: dict[str, Any]):
        import wandb

        # offline: files under root/wandb, no login, no network; quiet: the console stays ours
        self.run = wandb.init(mode="offline", dir=str(root), project="taurl", name=name,
                              config=config, settings=wandb.Settings(silent=True, console="off",
                                                      x_disable_stats=True))
        self.phases: set[str] = set()

    def log(self, row: dict[str, Any]) -> None:
        phase = row.get("phase", "run")
        if phase not in self.phases:  # each phase's curves use that phase's own step
            self.phases.add(phase)
            self.run.define_metric(f"{phase}/step")
            self.run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
        self.run.log({**scalars(row), f"{phase}/step": int(row["step"])})

    def close(self) -> None:
        self.run.finish()


class TrackedMetricsWriter(MetricsWriter):
    """A `MetricsWriter` that hands every row it writes to its sinks too."""

    def __init__(self, path: str | Path, sinks: list[Sink]):
        super().__init__(path)
        self.sinks = sinks

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        row = super().write(step, metrics)
        for s in self.sinks:
            s.log(row)
        return row


@contextlib.contextmanager
def metrics_writer(path: Path, trackers: list[str], root: Path,
                   config: dict[str, Any]) -> Iterator[MetricsWriter]:
    """The run's metrics writer with the configured sinks, closed (flushed) on exit."""
    sinks: list[Sink] = []
    try:
        for name in trackers:
            sinks.append(TensorBoardSink(root / "tensorboard") if name == "tensorboard"
                         else WandbSink(root, root.resolve().name, config))
        yield TrackedMetricsWriter(path, sinks)
    finally:
        for s in sinks:
            s.close()


def read_wandb_history(path: str | Path) -> list[dict[str, Any]]:
    """The logged history rows of an offline W&B run file (``run-<id>.wandb``).

    The file is a LevelDB-style log (W&B's ``datastore`` format): a 7-byte header
    (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of records, each with a header
    ``<crc32 (4), length (2), type (1)>`` (type 1 full, 2 first, 3 middle, 4 last part); the
    payloads are `wandb_internal_pb2.Record` protobufs. Checksums are verified.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B" or struct.unpack("<HB", data[4:7]) != (0xBEE1, 0):
        raise ValueError(f"{path} is not a W&B run file (header {data[:7]!r})")
    block, pos, part, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += block - pos % block
            continue
        payload = data[pos + 7:pos + 7 + length]
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: record at byte {pos} fails its checksum")
        pos += 7 + length
        part = payload if kind in (1, 2) else part + payload
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(part)
            if rec.WhichOneof("record_type") == "history":
                out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                            for i in rec.history.item})
    return out
