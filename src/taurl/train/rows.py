"""The rows the learner trains on: padding, action logprobs, micro-batches.

`make_rows` pads trajectories into aligned (B, L) tensors (action mask, behaviour logprobs,
per-token advantages); `action_logprobs` is one forward of the model for log π at the action
positions; `micro_batches` cuts a batch into length buckets for gradient accumulation. The
learner, the SFT step, the critic and the step scorer all read their batches through here.

Logits come from the model's own forward (``model(...).logits``), never from its decoder
and output layer called apart, so any HF causal LM works as it was built: GPT-2's
``transformer``/``lm_head`` naming, GPT-NeoX's ``embed_out``, final-logit scaling or
soft-capping (Gemma 2, Cohere, Granite) applied inside the forward. The forward is asked
for the logits of the positions that predict an action token only (``logits_to_keep``
with those columns, where the model accepts it), which is most of the saving on a small
model; logprobs are scattered back to (B, L) so the objectives keep their aligned shapes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from taurl.credit import broadcast_to_tokens, padded_token_turn_index
from taurl.data.trajectory import Trajectory
from taurl.errors import ContractError
from taurl.train.token_logprobs import gathered_logprobs


@dataclass(frozen=True)
class Rows:
    """Right-padded rows of trajectories. All (B, L); mask is 1 on action tokens only."""

    input_ids: Tensor  # long
    attention: Tensor  # long, 1 on real tokens
    mask: Tensor  # float, the action mask
    behaviour: Tensor  # float, behaviour logprobs (0 off the mask)
    advantages: Tensor  # float, per-token advantages (0 off the mask)


def make_rows(trajs: Sequence[Trajectory], advantages: np.ndarray | None, pad_id: int,
              device: torch.device | str | None = None,
              token_keep: Callable[[Trajectory], Sequence[float]] | None = None) -> Rows:
    """Pad `trajs` into `Rows` on `device`; `advantages` (N, T) per turn (None: zeros, e.g. for
    SFT). token_keep(traj): per-token weights multiplied into the action mask (e.g. the async
    schedule's ``mask_stale``: 0 on the older versions' part of a partial rollout).
    Each trajectory is one token stream: a chain is refused (ContractError "stream_rows")."""
    if chained := [t.episode_id for t in trajs if t.stream_starts]:
        raise ContractError("stream_rows", f"episodes {chained[:3]} are chains of several token "
                                           "streams; a row "
                            "is one stream: split them with taurl.data.chains.stream_views (the "
                            "learner does)")
    width = max(t.num_tokens for t in trajs)
    n = len(trajs)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width))
    beh = torch.zeros((n, width))
    for i, t in enumerate(trajs):
        k = t.num_tokens
        ids[i, :k] = torch.tensor(t.token_ids)
        attn[i, :k] = 1
        mask[i, :k] = torch.tensor(t.action_mask, dtype=torch.float32)
        if token_keep is not None:
            mask[i, :k] *= torch.tensor(token_keep(t), dtype=torch.float32)
        # an RL row forms a ratio: a record no policy sampled (a demonstration) has no
        # behaviour logprobs and is refused here (ContractError) instead of reading zeros
        beh[i, :k] = torch.tensor(t.behaviour_logprobs if advantages is not None else t.logprobs,
                                  dtype=torch.float32)
    adv = torch.zeros((n, width))
    if advantages is not None:
        adv = torch.from_numpy(broadcast_to_tokens(advantages,
                                                   padded_token_turn_index(trajs, width))).float()
    rows = Rows(ids, attn, mask, beh, adv)
    if device is None:
        return rows
    return Rows(*(x.to(device) for x in (ids, attn, mask, beh, adv)))


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (where its inputs must go)."""
    return next(model.parameters()).device


def action_logprobs(model: torch.nn.Module, rows: Rows, temperature: float = 1.0,
                    with_entropy: bool = False,
                    entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """log π(x_t | x_<t) (B, L) at action positions (0 elsewhere), and the entropy there.

    One call of the model's own forward. Positions are explicit, ``p_t = Σ_{s<=t} a_s − 1``
    (a = attention), so the rows may be padded on either side. Only the columns whose *next*
    token is an action token in some row are turned into logits (logits at t−1 predict
    token t), as in `taurl.train.objectives.sequence_logprobs` without the (B, L, V) logits;
    their log-softmax is taken a chunk of positions at a time (`taurl.train.token_logprobs`).
    The entropy carries a gradient only with `entropy_grad` (an entropy bonus).
    """
    sel = rows.mask[:, 1:].bool()  # (B, L-1): token t+1 is an action token
    cols = sel.any(0).nonzero().squeeze(-1)  # (C,) columns any row needs
    lp = torch.zeros(rows.mask.shape, device=rows.mask.device)
    ent = torch.zeros_like(lp) if with_entropy else None
    if cols.numel() == 0:
        return lp, ent
    logits = column_logits(model, rows, cols)
    # (K,)
    picked, h = gathered_logprobs(logits[sel[:, cols]], rows.input_ids[:, 1:][sel], temperature,
                                  entropy=with_entropy, entropy_grad=entropy_grad)
    if picked.dtype != lp.dtype:  # a float64 model's logprobs stay fp64 (fp32 otherwise)
        lp = lp.to(picked.dtype)
        ent = ent.to(picked.dtype) if ent is not None else None
    lp[:, 1:] = lp[:, 1:].masked_scatter(sel, picked)
    if ent is not None and h is not None:
        ent[:, 1:] = ent[:, 1:].masked_scatter(sel, h)
    return lp, ent


def column_logits(model: torch.nn.Module, rows: Rows, cols: Tensor) -> Tensor:
    """The model's logits (B, C, V) at columns `cols` only, from one call of its own forward
    with explicit positions (`action_logprobs`); `logits_to_keep` where the model takes it."""
    params = _forward_params(model)
    kw: dict[str, Any] = {"attention_mask": rows.attention}
    if "position_ids" in params:
        kw["position_ids"] = (rows.attention.cumsum(-1) - 1).clamp(min=0)
    if "logits_to_keep" in params:
        kw["logits_to_keep"] = cols
    # (B, C, V), or (B, L, V) without logits_to_keep
    logits = model(input_ids=rows.input_ids, **kw).logits
    return logits if "logits_to_keep" in params else logits[:, cols]


def _forward_params(model: torch.nn.Module) -> Any:
    # a wrapper (DDP, compile) forwards to the module it wraps; peft's (LoRA) passes the
    # keywords through to its base model's forward
    inner = getattr(model, "module", model)
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    return inspect.signature(inner.forward).parameters


# A micro-batch's fixed cost (one forward + backward call), in padded tokens: the partition
# below trades a little padding for fewer calls. Measured on the demo policy: a call costs
# about as much as 30-60 padded tokens on one CPU thread.
MICRO_BATCH_COST_TOKENS = 64


def micro_batches(trajs: Sequence[Trajectory], max_tokens: int) -> list[list[int]]:
    """Indices of `trajs` cut into length buckets of at most `max_tokens` padded tokens.

    Sorted by length, then cut where the padded total is smallest: a bucket of rows
    sorted ascending costs ``len(bucket) * longest + MICRO_BATCH_COST_TOKENS``, and the
    cuts minimise the sum over buckets by dynamic programming over the sorted lengths
    (the optimal partition into contiguous runs; O(n * rows per bucket)). A greedy fill
    (one bucket until the next row would not fit) put a 220-token row beside 40-token ones
    on the demo batch: 50% padding, against 9% here. A row longer than `max_tokens` is a
    bucket of its own.
    """
    order = sorted(range(len(trajs)), key=lambda i: trajs[i].num_tokens)
    lens = [trajs[i].num_tokens for i in order]
    n = len(lens)
    best = [0.0] + [float("inf")] * n  # best[i]: the cheapest cut of the first i sorted rows
    cut = [0] * (n + 1)
    for i in range(1, n + 1):  # the last bucket is order[j:i]; its widest row is lens[i - 1]
        width = lens[i - 1]
        for j in range(i - 1, -1, -1):
            size = i - j
            if size > 1 and size * width > max_tokens:
                break
            cost = best[j] + size * width + MICRO_BATCH_COST_TOKENS
            if cost < best[i]:
                best[i], cut[i] = cost, j
    out: list[list[int]] = []
    i = n
    while i > 0:
        out.append(order[cut[i]:i])
        i = cut[i]
    return out[::-1]
