"""Which rank trains which micro-batch: a split balanced by tokens (pure).

The learner cuts a batch into micro-batches (`taurl.train.rows.micro_batches`); with N
ranks each rank takes some of them. The step waits for the slowest rank, so the split
balances the ranks' padded tokens (the work of a forward and backward): longest
processing time first (Graham 1969, "Bounds on multiprocessing timing anomalies"): the
micro-batches by cost, largest first, each to the rank with the least so far. Its
makespan is at most 4/3 - 1/(3N) of the optimum.

Every rank then runs the same number of passes, `slots(...)`: a rank with fewer
micro-batches runs empty ones (`taurl.train.distributed.rank`), because FSDP's forward and
backward are collectives that every rank must join, and a rank with none at all must
still join the gradient reduction.
"""

from __future__ import annotations

from collections.abc import Sequence


def assign_micro_batches(costs: Sequence[float], world_size: int) -> list[list[int]]:
    """Indices of the micro-batches (with `costs`, e.g. padded tokens) for each of
    `world_size` ranks, balanced by cost (module docstring); each rank's in ascending order.

    Ties go to the rank with fewer micro-batches, then the lower rank, so the split is a
    function of the costs alone: every rank computes the same one.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1 (got {world_size})")
    load = [0.0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], len(out[r]), r))
        out[rank].append(i)
        load[rank] += costs[i]
    return [sorted(x) for x in out]


def slots(assignment: Sequence[Sequence[int]]) -> int:
    """Passes each rank runs per epoch: the most micro-batches any rank holds (at least 1,
    so a step always reduces gradients on every rank)."""
    return max(1, *(len(x) for x in assignment))
