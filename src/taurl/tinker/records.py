"""What the service records in its run directory.

- ``ledger.sqlite`` (`taurl.data.ledger.Ledger`, the store every taurl run writes): one
  trajectory per sampled sequence, token-exact (`sample_records`), so ``taurl export RUN``
  reads a service run like any other. Its segments are the prompt ids (mask 0) and the
  sampled ids (mask 1) with their logprobs ``log_softmax(logits / T)[id]`` and
  ``policy_version``: the optimizer steps of the training client when it saved the sampler
  weights (0 for the base model). ``metadata["tinker"]`` names those weights exactly
  (``model_path``, the ``tinker://`` path, None for the base; ``model_id``, the training
  client that saved them), the session, sampler, request and sequence ids, the sampling
  parameters and, when asked for, the prompt logprobs. A request's ``num_samples``
  sequences share a ``group_id``; equal prompts share a ``task_id``.
- ``metrics.jsonl`` (`taurl.monitor.metrics.MetricsWriter`): one row per training call
  (``tinker/op``: create_model, forward, forward_backward, optim_step, save_state,
  load_state, save_weights_for_sampler), its ``step`` the model's optimizer steps.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taurl.data.ledger import Ledger
from taurl.data.trajectory import (
    Segment,
    StopReason,
    Trajectory,
    Turn,
    sampling_record,
)
from taurl.errors import Error
from taurl.monitor.metrics import MetricsWriter

ENV_NAME = "tinker"  # `Trajectory.env_name` of a sampled sequence
ENV_VERSION = "sample-v1"  # changes if what a service record means changes
SPLIT = "tinker"  # the service cannot tell training samples from evaluation ones


@dataclass(frozen=True)
class SampledSequence:
    """One sequence an ``asample`` request answered, as the engine produced it."""

    sequence_id: str  # what the SDK was told (``sample_sequence_ids``)
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # the engine's: "stop" | "eos" | "length"
    seed: int | None


@dataclass(frozen=True)
class SampleSource:
    """Who sampled: the sampler, its weights (``tinker://`` path, None: the base model),
    their version and the request's identity."""

    request_id: str
    session_id: str | None
    sampler_id: str
    base_model: str
    model_path: str | None
    version: int


def _stop(finish_reason: str) -> tuple[StopReason, bool]:
    """(stop reason, terminated): `max_tokens` is a truncation; a stop string/id or EOS ends it."""
    if finish_reason == "length":
        return StopReason.MAX_TOKENS, False
    return StopReason("eos" if finish_reason == "eos" else "stop_sequence"), True


def task_id(prompt: Sequence[int]) -> str:
    """Equal prompt ids, equal task id (a digest of the ids)."""
    return "prompt-" + hashlib.sha256(",".join(map(str, prompt)).encode()).hexdigest()[:16]


def sample_records(run_id: str, source: SampleSource, prompt: list[int],
                   seqs: Sequence[SampledSequence], sampling_params: dict[str, Any],
                   decode: Callable[[list[int]], str],
                   prompt_logprobs: list[float | None] | None = None) -> list[Trajectory]:
    """The ledger trajectories of one answered ``asample`` request (one per sequence)."""
    weights_run = source.model_path[len("tinker://"):].split("/")[0] if source.model_path else None
    out = []
    for s in seqs:
        stop, terminated = _stop(s.finish_reason)
        tinker = {"request_id": source.request_id, "sequence_id": s.sequence_id,
                  "session_id": source.session_id, "sampler_id": source.sampler_id,
                  "base_model": source.base_model, "model_path": source.model_path,
                  "model_id": weights_run, "sampling_params": sampling_params}
        if prompt_logprobs is not None:
            tinker["prompt_logprobs"] = prompt_logprobs
        text = decode(s.tokens)
        out.append(Trajectory(
            episode_id=s.sequence_id, run_id=run_id, task_id=task_id(prompt),
            group_id=source.request_id, split=SPLIT, env_name=ENV_NAME, env_version=ENV_VERSION,
            seed=s.seed if s.seed is not None else 0,
            segments=(Segment("prompt", tuple(prompt)),
                      Segment("action", tuple(s.tokens), tuple(float(x) for x in s.logprobs),
                              source.version)),
            turns=(Turn(index=0, action_text=text, action={"kind": "completion"},
                        observation_text="", action_segment=1, observation_segment=None,
                        finish_reason=s.finish_reason),),
            messages=(), terminated=terminated, truncated=not terminated, stop_reason=stop,
            metadata={"sampling": sampling_record(sampling_params.get("temperature", 1.0),
                                                  sampling_params.get("top_p", 1.0)),
                      "tinker": tinker}))
    return out


class Recorder:
    """The run's ledger and metrics (calls come from the event loop and the compute thread)."""

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = run_dir.resolve().name
        self.ledger = Ledger(run_dir / "ledger.sqlite")
        self.metrics = MetricsWriter(run_dir / "metrics.jsonl")
        self._lock = threading.Lock()

    def samples(self, trajectories: list[Trajectory]) -> None:
        """Store one request's sequences in one transaction; a refusal is a server bug."""
        report = self.ledger.append_many(trajectories)
        if not report.ok:
            raise Error(f"the ledger refused sampled sequences: {report.rejected[:3]}")

    def training(self, op: str, model_id: str, step: int, **fields: Any) -> None:
        row = {"tinker/op": op, "tinker/model_id": model_id,
               **{f"tinker/{k}": v for k, v in fields.items()}}
        with self._lock:
            self.metrics.write(step, row)

    def close(self) -> None:
        self.ledger.close()


def read_samples(run_dir: Path) -> list[Trajectory]:
    """Every sampled sequence a service run recorded, in the order it was stored."""
    with Ledger(Path(run_dir) / "ledger.sqlite") as ledger:
        return [t for t in ledger.iter_query() if t.env_name == ENV_NAME]
