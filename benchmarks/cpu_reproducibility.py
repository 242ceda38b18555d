"""Do a seed's results follow the CPU, and does pinning the kernels' ISA make them not?

The demo's figures are the same for a seed on one machine however loaded (lock-step
batching fixes the batch), but a fresh machine of the same kind gave other figures: the
float path of a matmul depends on which kernel the libraries dispatch to, and they choose by
the CPU (its vector ISA, and for MKL its vendor). Three libraries choose:

- ATen's own vectorised kernels: ``ATEN_CPU_CAPABILITY`` (default | avx2 | avx512);
- MKL's BLAS (torch's ``BLAS_INFO=mkl``): ``MKL_CBWR`` (conditional numerical
  reproducibility: the same code branch on every CPU that supports it) and
  ``MKL_ENABLE_INSTRUCTIONS`` (the highest ISA it may use);
- oneDNN: ``ONEDNN_MAX_CPU_ISA``.

One machine cannot be two CPUs, so a host of another generation is *emulated* by capping
what the three may use (an AVX2-only host dispatches as this host does with the caps). Each
setting runs in a fresh process (the variables are read once, at library load): the demo's
tiny Qwen2 (1.05M parameters) takes 40 AdamW steps on fixed random batches, then samples 64
sequences of 48 tokens. The result's fingerprint is a hash of the final weights and the
sampled ids; the time is the wall of the steps and the sampling (median of ``--reps``).

    python benchmarks/cpu_reproducibility.py --reps 3

Prints one JSON object: per setting, the fingerprint, the final loss and the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# what each library may use; "pinned" is the candidate for the demo
SETTINGS: dict[str, dict[str, str]] = {
    "this_host": {},
    "avx2_host_emulated": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    },
    "pinned": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "pinned_on_avx2_host_emulated": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
}


def workload() -> dict[str, object]:
    """One process's run: train the tiny policy a little, then sample; fingerprint both."""
    import hashlib
    import time

    import torch

    from taurl.policy.model import tiny_config

    torch.set_num_threads(1)  # the demo's torch_threads: one thread, one reduction order
    cfg = tiny_config(1024)
    torch.manual_seed(0)
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(3, 1024, (16, 64), generator=g) for _ in range(8)]
    t0 = time.perf_counter()
    loss = torch.zeros(())
    for step in range(40):
        ids = batches[step % len(batches)]
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    ids = torch.full((64, 1), 3)
    gs = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for _ in range(48):
            logits = model(input_ids=ids).logits[:, -1].float()
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gs)
            ids = torch.cat([ids, nxt], 1)
    dt = time.perf_counter() - t0
    h = hashlib.sha256()
    for p in model.state_dict().values():
        h.update(p.detach().contiguous().numpy().tobytes())
    h.update(ids.numpy().tobytes())
    return {
        "fingerprint": h.hexdigest()[:16],
        "loss": float(loss),
        "seconds": dt,
        "capability": torch.backends.cpu.get_cpu_capability(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=3, help="runs per setting, alternating settings")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(workload()))
        return
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in SETTINGS}
    for _ in range(args.reps):
        for name, env in SETTINGS.items():  # alternating: load drifts hit every setting alike
            out = subprocess.run(
                [sys.executable, __file__, "--child"],
                capture_output=True,
                text=True,
                env={**os.environ, **env},
                check=True,
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    report = {
        name: {
            "env": SETTINGS[name],
            "fingerprints": sorted({str(r["fingerprint"]) for r in rs}),
            "loss": rs[0]["loss"],
            "capability": rs[0]["capability"],
            "seconds": [round(float(r["seconds"]), 2) for r in rs],
            "median_s": round(statistics.median(float(r["seconds"]) for r in rs), 2),
        }
        for name, rs in runs.items()
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
