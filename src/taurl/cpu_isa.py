"""Pin the CPU kernels' instruction set, so a seed's figures do not follow the CPU model.

A matmul's float path depends on the kernel its library dispatches to, and three libraries
under torch choose by the CPU: ATen's vectorised kernels (``ATEN_CPU_CAPABILITY``), MKL's
BLAS (``MKL_CBWR``, its conditional numerical reproducibility) and oneDNN
(``ONEDNN_MAX_CPU_ISA``). Capped at AVX2 -- which every x86-64 CPU of the last decade has --
the same seed takes the same float path on an AVX-512 and an AVX2 machine
(`benchmarks/cpu_reproducibility.py` measures it: this host's default path differs from an
emulated AVX2 host's, the pinned one equals it bit for bit, at no measured cost for the
demo's tiny policy). `taurl demo` pins; any other command runs the CPU's native kernels,
and a user pins a run of theirs by exporting the same variables (docs/reproducibility.md).

The variables are read when the libraries load, so pinning works only before torch is
imported; a variable the user set is never overridden.
"""

from __future__ import annotations

import os
import platform
import sys

PINNED_ISA: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}


def pin_cpu_isa(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set `PINNED_ISA` as defaults in `environ` (the process's) on x86-64 before torch loads.

    Returns what it set (empty: another architecture, torch already loaded, or the user's
    own values win). ``TAURL_CPU_ISA=native`` turns it off.
    """
    env = os.environ if environ is None else environ
    if env.get("TAURL_CPU_ISA", "").lower() == "native" or "torch" in sys.modules:
        return {}
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    chosen = {k: v for k, v in PINNED_ISA.items() if k not in env}
    env.update(chosen)
    return chosen
