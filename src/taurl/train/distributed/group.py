"""The process group of the learner's ranks: gloo on CPU, nccl on CUDA.

A rank reads its place from the environment, as torchrun sets it (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so one code path serves both launchers: taurl's own
(`taurl.train.distributed.pool`, local processes on loopback) and yours (torchrun, SLURM).
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

# a collective that waits longer than this fails instead of hanging the run (a rank died)
TIMEOUT = datetime.timedelta(minutes=10)


@dataclass(frozen=True)
class Place:
    """This rank's place in the group."""

    rank: int
    world_size: int
    device: torch.device  # this rank's: cuda:LOCAL_RANK, or cpu


def backend_for(device: torch.device) -> str:
    """nccl for CUDA tensors, gloo for CPU ones (the backends torch ships for each)."""
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: str, local_rank: int) -> torch.device:
    """The device of a rank: its own GPU (cuda:LOCAL_RANK) when `device` is CUDA, else cpu.
    `device` is the recipe's placement (cpu | cuda | cuda:N | auto)."""
    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return torch.device("cuda", local_rank) if wants_cuda else torch.device("cpu")


def join(device: str = "cpu") -> Place:
    """Join the group described by the environment (module docstring); returns this rank's place."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = rank_device(device, int(os.environ.get("LOCAL_RANK", rank)))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend_for(dev), rank=rank, world_size=world, timeout=TIMEOUT)
    return Place(rank, world, dev)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it), for MASTER_PORT."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
