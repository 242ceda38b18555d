"""What the service records in its run directory.

- ``tinker_samples.jsonl``: one JSON object per ``asample`` request, token-exact: the
  prompt ids, each sampled sequence's ids, logprobs, stop reason and sequence id, the
  sampler, its weights (``model_path``, None for the base model) and their version (the
  training client's optimizer steps when they were saved), the sampling parameters and,
  when asked for, the prompt logprobs.
- ``metrics.jsonl`` (`taurl.monitor.metrics.MetricsWriter`): one row per training call
  (``tinker/op``: create_model, forward, forward_backward, optim_step, save_state,
  load_state, save_weights_for_sampler), its ``step`` the model's optimizer steps.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from taurl.monitor.metrics import MetricsWriter

SAMPLES = "tinker_samples.jsonl"


class Recorder:
    """Appends records under a lock (calls come from the event loop and the compute thread)."""

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.samples_path = run_dir / SAMPLES
        self.metrics = MetricsWriter(run_dir / "metrics.jsonl")
        self._lock = threading.Lock()

    def sample(self, record: dict[str, Any]) -> None:
        line = json.dumps({"time": time.time(), **record}, sort_keys=True)
        with self._lock, self.samples_path.open("a") as f:
            f.write(line + "\n")

    def training(self, op: str, model_id: str, step: int, **fields: Any) -> None:
        row = {"tinker/op": op, "tinker/model_id": model_id,
               **{f"tinker/{k}": v for k, v in fields.items()}}
        with self._lock:
            self.metrics.write(step, row)


def read_samples(run_dir: Path) -> list[dict[str, Any]]:
    """Every sample record of a run directory, in order."""
    path = Path(run_dir) / SAMPLES
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
