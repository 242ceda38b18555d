"""The learner's side of chains: one row per token stream, the episode's credit on each.

An episode of several token streams (`taurl.data.streams`) is trained as its streams: each
is its own row (the ids the model read when it sampled, never the concatenation), and the
per-turn advantages computed on the whole episode are given to the turns each stream holds,
so the episode's credit reaches every stream's action tokens.

How much an episode weighs (`LearnerConfig.segment_weighting`), with the default
``token-mean`` aggregation over the batch's N action tokens (all streams), E episodes, and
episode e's n_e trained action tokens:

    token    ∇L = (1/N) Σ_e Σ_{t∈e} A_e ∇ℓ_t          every action token weighs the same:
                                                      an episode weighs n_e/N, so one whose
                                                      chain holds more sampled tokens (more
                                                      turns, a sampled summary per stream)
                                                      pulls harder
    episode  ∇L = (1/E) Σ_e (1/n_e) Σ_{t∈e} A_e ∇ℓ_t  every episode weighs 1/E whatever its
                                                      streams and tokens (the episode's token
                                                      mean; a chain of one is weighed so too)

(ℓ_t is the objective's per-token term, e.g. PPO's clipped ratio; for a positive weight c,
PPO's clipped surrogate of c·A is c times that of A, so ``episode`` is applied as the factor
c_e = N / (E·n_e) on the episode's advantages, the token-mean denominator N unchanged.) The
weighting acts on the policy-gradient term; a KL or entropy term stays a token mean.
``episode`` takes ``aggregation: token-mean``; ``token`` with a ``seq-mean-*`` aggregation
counts each stream as a sequence, so an episode of K streams weighs K sequences there.

A sampled summary (`taurl.rollout.compaction`, ``summary: masked``) is recorded as the
action it is (ids, logprobs, version) with ``action["trained"] = False``: `untrained_keep`
takes it off the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from taurl.data.chains import stream_turns, stream_views
from taurl.data.trajectory import Trajectory
from taurl.errors import ConfigError

SEGMENT_WEIGHTINGS = ("token", "episode")


def weighting_problems(weighting: str, aggregation: str) -> list[str]:
    if weighting not in SEGMENT_WEIGHTINGS:
        return [f"segment_weighting must be one of {', '.join(SEGMENT_WEIGHTINGS)} (got "
                f"{weighting!r})"]
    if weighting == "episode" and aggregation != "token-mean":
        return ["segment_weighting episode weighs each episode itself (its token mean, 1/E per "
                f"episode); it needs aggregation token-mean (got {aggregation!r}), or use "
                "segment_weighting token"]
    return []


def trained_tokens(traj: Trajectory) -> int:
    """Action tokens of `traj` the loss sees (a masked summary's are not)."""
    off = sum(len(traj.segments[t.action_segment].token_ids) for t in traj.turns if _untrained(t))
    return traj.num_action_tokens - off


def _untrained(turn) -> bool:
    return turn.action.get("trained") is False


def split_streams(trajs: Sequence[Trajectory], adv: np.ndarray,
                  weighting: str = "token") -> tuple[list[Trajectory], np.ndarray]:
    """The rows of `trajs` (one per stream with action tokens) and their per-turn advantages.

    adv: (N, T) per-turn advantages of `trajs` (credit of whole episodes). Returns the views
    (`taurl.data.chains.stream_views`) and (V, T') advantages, each view's row holding its
    own turns' values, scaled by the episode's weight (module docstring).
    """
    scale = np.ones(len(trajs))
    if weighting == "episode" and len(trajs):
        n = np.array([max(trained_tokens(t), 1) for t in trajs], dtype=np.float64)
        scale = n.sum() / (len(trajs) * n)
    views: list[Trajectory] = []
    rows: list[np.ndarray] = []
    for i, t in enumerate(trajs):
        for view, owned in zip(stream_views(t), stream_turns(t), strict=True):
            if view.num_action_tokens == 0:
                # a stream with nothing sampled (a compaction's prompt and a closing) trains nothing
                continue
            views.append(view)
            rows.append(adv[i, owned] * scale[i] if len(owned) else np.zeros(0))
    width = max([1] + [r.size for r in rows])
    out = np.zeros((len(rows), width), dtype=np.float64)
    for j, r in enumerate(rows):
        out[j, :r.size] = r
    return views, out


def untrained_keep(traj: Trajectory) -> list[float]:
    """Per-token loss weights of a one-stream record: 0 on a masked summary's ids, else 1."""
    keep = [1.0] * traj.num_tokens
    starts = np.cumsum([0] + [len(s.token_ids) for s in traj.segments])
    for t in traj.turns:
        if _untrained(t):
            keep[starts[t.action_segment]:starts[t.action_segment + 1]] = [0.0] * (
                starts[t.action_segment + 1] - starts[t.action_segment])
    return keep


def with_untrained(keep: Callable[[Trajectory], Sequence[float]] | None
                   ) -> Callable[[Trajectory], Sequence[float]]:
    """`keep` (the learner's per-token weights, or None) times `untrained_keep`."""
    def combined(traj: Trajectory) -> Sequence[float]:
        base = untrained_keep(traj)
        return base if keep is None else [a * b for a, b in zip(base, keep(traj), strict=True)]
    return combined


def refuse_critic_chains(critic: object, trajs: Sequence[Trajectory]) -> None:
    """A critic reads V(s_t) off one token stream per episode: a chain is refused, not misread."""
    if critic is not None and any(t.stream_starts for t in trajs):
        raise ConfigError("a value-based estimator (gae) cannot score an episode of several token "
                          "streams (a compacted one); use an outcome estimator (grpo, rloo, gigpo)")
