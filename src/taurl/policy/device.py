"""Where the models of a run live: ``device: auto | cpu | cuda | cuda:N`` and ``torch_dtype``.

taurl needs no GPU, and nothing may keep one from being used: the recipe loads the policy,
the KL reference, the critic and the step scorer (they follow the policy) on `resolve_device`
in `resolve_dtype`, and every tensor the learner, SFT and the engine create is made on the
device of the model it feeds (`taurl.train.rows.model_device`). ``auto`` is the first CUDA
device when one is available, else the CPU. ``torch_dtype``: ``float32`` (the default, and
what a CPU run should use) or ``bfloat16`` where the device supports it (half the memory;
behaviour logprobs then carry bf16 rounding, docs/models-and-engines.md measures it).
"""

from __future__ import annotations

import re

import torch

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def device_problems(device: str, dtype: str) -> list[str]:
    """Every problem with a `device` / `torch_dtype` pair on this machine (config validation)."""
    out = []
    if not isinstance(device, str) or not DEVICE_PATTERN.match(device):
        return [f"device must be auto, cpu, cuda or cuda:N (got {device!r})"]
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            out.append(f"device {device}: no CUDA device is available here "
                       "(torch.cuda.is_available() is False); use device: cpu, or auto (CUDA when "
                       "there is one)")
        elif ":" in device and int(device.split(":")[1]) >= torch.cuda.device_count():
            out.append(f"device {device}: this machine has {torch.cuda.device_count()} CUDA "
                       f"device(s) (cuda:0 .. cuda:{torch.cuda.device_count() - 1})")
    if dtype not in DTYPES:
        out.append(f"torch_dtype must be one of {', '.join(DTYPES)} (got {dtype!r}); float16 is "
                   "not offered: its range needs loss scaling, which the learner does not do")
    elif dtype == "bfloat16" and not out and resolve_device(device).type == "cuda" \
            and not torch.cuda.is_bf16_supported():
        out.append("torch_dtype bfloat16: this CUDA device does not support bfloat16; use float32")
    return out


def resolve_device(device: str = "auto") -> torch.device:
    """The torch device of a config's `device` (``auto``: CUDA when available, else CPU)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str = "float32") -> torch.dtype:
    return DTYPES[dtype]
