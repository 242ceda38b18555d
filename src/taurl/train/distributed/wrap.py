"""The model of a rank: replicated (DDP) or sharded (FSDP2), with gradients SUMMED over ranks.

    ddp    DistributedDataParallel: every rank holds the whole model and optimizer state;
           the gradients are all-reduced once per step.
    fsdp   FSDP2 `fully_shard` on each decoder layer, then on the root (embeddings, final
           norm, output layer): every rank holds 1/N of the parameters, gradients and AdamW
           moments; a layer's parameters are all-gathered for its forward and backward, its
           gradients reduce-scattered.

Why summed: the loss of every micro-batch is already divided by the GLOBAL denominator
(the whole batch's action tokens, or rows; `taurl.train.distributed.rank`), so the gradient
of the batch is the SUM of the ranks' gradients. Both wrappers average by default, which
would divide the step by N; here DDP gets a summing communication hook and FSDP a gradient
divide factor of 1 (its reduction forced to a plain sum, which gloo supports), so N ranks
take the step one rank takes on the same batch.

The full state dicts (weights for the checkpoint and the engines, AdamW state for a resume)
are gathered on rank 0 in the single-process formats: the weights keyed by the model's own
names, the optimizer state keyed by parameter index as `torch.optim.AdamW.state_dict()`
writes it, so a checkpoint of a distributed run loads into a single-process one and back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel

from taurl.train.distributed.group import Place

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU

def wrap(model: torch.nn.Module, strategy: str, place: Place) -> torch.nn.Module:
    """`model` (on `place.device`) as the rank's replica (ddp) or shard (fsdp), gradients summed."""
    if strategy == "ddp":
        ids = [place.device] if place.device.type == "cuda" else None
        # the buffers (rotary frequencies) are constants: no broadcast of them in every forward
        ddp = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
        ddp.register_comm_hook(None, _sum_hook)
        return ddp
    if strategy == "fsdp":
        mesh = init_device_mesh(place.device.type, (place.world_size,))
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for m in model.modules():
            if isinstance(m, FSDPModule):  # per module: each has its own parameter group
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        return model
    raise ValueError(f"strategy must be ddp or fsdp here (got {strategy!r})")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of an HF model, named by its ``_no_split_modules`` (Qwen2DecoderLayer,
    GPT2Block, ...); none found: the root alone is sharded."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def _sum_hook(state, bucket):  # noqa: ANN001,ANN202 — DDP checks real annotations, not strings
    """DDP's all-reduce without its division by the world size."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


@contextlib.contextmanager
def grad_sync(model: torch.nn.Module, on: bool) -> Iterator[None]:
    """Run a forward and backward with the gradient reduction `on` or off: off, the gradients
    accumulate locally; the step's last pass turns it on. Every rank runs the same passes."""
    if isinstance(model, DistributedDataParallel) and not on:
        with model.no_sync():
            yield
        return
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(on)
    yield


def empty_pass(model: torch.nn.Module, pad_id: int, device: torch.device) -> None:
    """A forward and backward of one pad token with a zero loss: the collectives of a pass
    (FSDP's all-gathers and reductions, DDP's all-reduce) joined, no gradient added."""
    ids = torch.full((1, 1), pad_id, dtype=torch.long, device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    (logits.sum() * 0.0).backward()


def plain(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a DDP wrapper (FSDP2 shards in place: the model itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def global_norm(norm: torch.Tensor) -> torch.Tensor:
    """`clip_grad_norm_`'s result as a plain tensor: over FSDP's sharded (DTensor) gradients it
    is the norm of the whole gradient already, held as a DTensor."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def reshard(model: torch.nn.Module) -> None:
    """Register FSDP's sharded parameters again. A forward without backward (an update with
    nothing to learn measures its micro-batches under no_grad) leaves the root's parameters
    gathered (FSDP2 does not reshard the root after forward), and then the model's parameters
    are not the optimizer's: the optimizer state could not be named."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on the CPU, on rank 0 (empty elsewhere); every rank calls it."""
    reshard(model)
    return get_model_state_dict(model, options=_FULL)


def _names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters, in its order (index i of its state dict)."""
    by_id = {id(p): n for n, p in plain(model).named_parameters()}
    return [by_id[id(p)] for g in optimizer.param_groups for p in g["params"]]


def full_optimizer_state(model: torch.nn.Module,
                         optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole AdamW state on rank 0, keyed by parameter index as a single-process
    ``optimizer.state_dict()`` (empty elsewhere); every rank calls it."""
    if not optimizer.state:  # before the first step: torch would take a zero step to make one
        return optimizer.state_dict()
    reshard(model)
    sd = get_optimizer_state_dict(model, optimizer, options=_FULL)
    if not sd:
        return {}
    index = {n: i for i, n in enumerate(_names(model, optimizer))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in sd["param_groups"]]
    return {"state": {index[n]: st for n, st in sd["state"].items()}, "param_groups": groups}


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                              state: dict[str, Any]) -> None:
    """Load a single-process AdamW state dict (`full_optimizer_state`'s format) on every rank."""
    reshard(model)
    names = _names(model, optimizer)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    sd = {"state": {names[i]: st for i, st in state["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, optim_state_dict=sd,
                             options=StateDictOptions(full_state_dict=True))
