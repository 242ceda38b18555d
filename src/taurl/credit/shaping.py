"""Process-reward shaping: per-turn scores from any scorer, small weight, clipped, kept apart.

docs/design.md#reward, layer 3: process rewards only fill the signal vacuum early; the outcome stays
the dominant term. A scorer (a rule, a PRM, an LLM judge) gives each turn a score; the
shaped reward is

    p_{i,t} = clip(w · score_{i,t}, −c, c)

It is stored in ``TurnBatch.process_rewards``, never added to ``rewards`` or
``step_rewards``, so every metric can show it apart. Estimators read it through
``batch.scores`` / ``batch.turn_rewards()``.

Source: potential-free additive shaping with clipping, as in PRM-shaped RL (e.g. "Process
Reinforcement through Implicit Rewards", arXiv 2502.01456, which adds weighted process
returns to outcome returns). Departure: no potential-based form (Ng et al. 1999); the
clip bounds how far shaping can move any one turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from taurl.credit.batch import TurnBatch
from taurl.data.trajectory import Trajectory
from taurl.errors import ConfigError, ContractError

TurnScorer = Callable[[Trajectory, int], float]


def score_turns(trajs: Sequence[Trajectory], scorer: TurnScorer, max_turns: int) -> np.ndarray:
    """(N, T) scores: ``scorer(traj, t)`` for each real turn t, 0 on padding."""
    out = np.zeros((len(trajs), max_turns))
    for i, tr in enumerate(trajs):
        for t in range(len(tr.turns)):
            out[i, t] = float(scorer(tr, t))
    return out


def shape_process_rewards(batch: TurnBatch, scores: np.ndarray, *, weight: float = 0.1,
                          clip: float = 0.2) -> tuple[TurnBatch, dict[str, float]]:
    """Put ``clip(weight · scores, −clip, clip)`` (N, T) into ``process_rewards``.

    Replaces any previous shaping. Returns the new batch and metrics (mean and |sum| per
    trajectory of the shaping, fraction of turns clipped).
    """
    if weight < 0:
        raise ConfigError(f"shaping weight must be >= 0, got {weight!r}")
    if not clip > 0:
        raise ConfigError(f"shaping clip must be > 0, got {clip!r}")
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != batch.turn_mask.shape:
        raise ContractError("shaping_shape", f"scores must be (N, T) = {batch.turn_mask.shape}, "
                                             f"got {scores.shape}")
    mask = batch.turn_mask
    if not np.all(np.isfinite(scores[mask])):
        raise ContractError("shaping_finite",
                            "a process scorer returned NaN or inf; fix the scorer")
    raw = np.where(mask, weight * scores, 0.0)
    shaped = np.clip(raw, -clip, clip)
    real = shaped[mask]
    stats = {
        "learn/shaping_mean": float(real.mean()) if real.size else 0.0,
        "learn/shaping_abs_per_traj": float(np.abs(shaped).sum(axis=1).mean())
        if mask.shape[0]
        else 0.0,
        "learn/shaping_clip_frac": float((raw[mask] != real).mean()) if real.size else 0.0,
    }
    return batch.replace(process_rewards=shaped), stats
