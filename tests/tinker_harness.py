"""Shared set-up of the Tinker API tests: a tiny random-init policy, the server on loopback,
the real `tinker` SDK pointed at it (tests/test_tinker_*.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from tinker import types  # noqa: F401  (re-exported for the tests)

TEXTS = [f"the city number {i} lies in country {i % 7} and its answer is {i * 3}"
         for i in range(200)]
MODEL = "tiny"


def build_policy(path: Path) -> Path:
    """A tiny Qwen2 built from scratch with a 400-token BPE (no download)."""
    from taurl.policy.model import build_default_policy

    build_default_policy(TEXTS, path, size="tiny", vocab_size=400, seed=0)
    return path


def start(policy: Path, run_dir: Path):
    """(server, ServiceClient): the server serving `policy` as "tiny", and a client of it."""
    os.environ.setdefault("TINKER_TELEMETRY", "0")  # no telemetry batches to the test server
    import tinker

    from taurl.tinker.server import TinkerServer

    server = TinkerServer({MODEL: str(policy)}, run_dir).start()
    return server, tinker.ServiceClient(base_url=server.url, api_key="tml-local")


def datum(tokens: list[int], **inputs):
    """A next-token datum over `tokens`: input tokens[:-1], targets tokens[1:]."""
    loss_inputs = {"target_tokens": np.asarray(tokens[1:], dtype=np.int64)}
    loss_inputs.update({k: np.asarray(v, dtype=np.float32) for k, v in inputs.items()})
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs=loss_inputs)


def loss(training_client, data, loss_fn: str = "cross_entropy") -> float:
    return training_client.forward(data, loss_fn).result().metrics["loss:sum"]


def logprobs(result) -> list[np.ndarray]:
    return [np.asarray(o["logprobs"].data, dtype=np.float32) for o in result.loss_fn_outputs]


SEQ = [17, 42, 99, 7] * 3  # a sequence the tests teach (each token names the next)
