"""What the Tinker API costs over calling taurl's learner in-process (`taurl serve-tinker`).

One training step (``forward_backward`` cross_entropy on one datum, then ``optim_step``) on
the tiny random-init Qwen2 of the tests, `--steps` times, two ways: through the unmodified
``tinker`` SDK on loopback (futures, polling, protobuf + zstd bodies), and by calling the
same `taurl.tinker.trainer.TrainingModel` directly. Also ``sample`` (1 sequence, 16 tokens)
through the SDK. One JSON line per repetition:

    sdk_step_ms, direct_step_ms   mean wall ms per step (submit, then wait, as a client does)
    overhead_ms                   sdk_step_ms − direct_step_ms
    sdk_sample_ms                 mean wall ms per sample request

    python benchmarks/tinker_roundtrip.py --steps 30 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    os.environ["TINKER_TELEMETRY"] = "0"
    import torch
    from tinker import types

    from taurl.tinker.wire import FwdBwdRequest, WireDatum
    from tinker_harness import MODEL, SEQ, build_policy, datum, start

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    server, service = start(build_policy(tmp / "policy"), tmp / "run")
    adam = types.AdamParams(learning_rate=1e-3)
    wire = FwdBwdRequest("", 0, "cross_entropy", {}, False, [WireDatum(
        SEQ[:-1], {"target_tokens": torch.tensor(SEQ[1:]).numpy()})])
    try:
        for rep in range(args.reps):
            tc = service.create_lora_training_client(MODEL, rank=8).result()
            t = time.perf_counter()
            for _ in range(args.steps):
                tc.forward_backward([datum(SEQ)], "cross_entropy")
                tc.optim_step(adam).result()
            sdk = (time.perf_counter() - t) / args.steps
            model = server.service.registry.models[tc.model_id]
            t = time.perf_counter()
            for _ in range(args.steps):
                model.forward_backward(wire)
                model.optim_step(adam)
            direct = (time.perf_counter() - t) / args.steps
            sampler = service.create_sampling_client(base_model=MODEL).result()
            params = types.SamplingParams(max_tokens=16, temperature=1.0, stop=[])
            t = time.perf_counter()
            for _ in range(10):
                sampler.sample(types.ModelInput.from_ints(SEQ[:4]), 1, params).result()
            print(json.dumps({"rep": rep, "steps": args.steps, "sdk_step_ms": 1e3 * sdk,
                              "direct_step_ms": 1e3 * direct,
                              "overhead_ms": 1e3 * (sdk - direct),
                              "sdk_sample_ms": 1e3 * (time.perf_counter() - t) / 10}), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
