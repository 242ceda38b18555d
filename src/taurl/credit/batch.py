"""The padded, per-turn view of a batch of grouped trajectories that every estimator reads.

N trajectories, T = the most turns any of them has. Row i is trajectory i; column t is its
turn t (its t-th action). Padding turns have ``turn_mask`` False and zeros elsewhere.

Rewards are kept in three places and never mixed in the record itself:

* ``rewards`` (N,): the episode's terminal outcome, credited at the last turn. A real
  rollout delivers the outcome inside the final `env.step` reward (``turn.env_reward`` of
  the last turn; ``traj.reward_components["outcome"]`` says how much of it is outcome), so
  `from_trajectories` moves that part off the last turn into ``rewards`` (plus any reward no
  turn carries, ``traj.reward - sum(turn.env_reward)``). Sums are unchanged (``scores``,
  ``turn_rewards``); estimators that treat the outcome apart (`segment_grpo`) see it.
* ``step_rewards`` (N, T): the environment's per-turn rewards (``turn.env_reward``), less
  the outcome moved off the last turn.
* ``process_rewards`` (N, T): process shaping (see `taurl.credit.shaping`), already weighted
  and clipped; zero unless a scorer was applied.

``scores`` = rewards + Σ_t (step + process) is the episode return (γ = 1) that outcome
estimators (GRPO, RLOO, …) compare inside a group; ``turn_rewards`` puts the same rewards on
the turns for estimators that discount.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from taurl.data.trajectory import Trajectory
from taurl.errors import ContractError

SUBGOAL_KEY = "subgoal_end"
_ROW_LABELS = ("roles", "match_ids", "env_names")  # optional per-row labels (multi-agent credit)


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text` that is the same in every process (Python's `hash` is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little",
                          signed=True)


@dataclass(frozen=True)
class Credit:
    """What an estimator returns.

    advantages: (N, T) float64, the advantage of each turn's action; exactly 0 where
        ``turn_mask`` is False. Broadcast to action tokens with
        `taurl.credit.tokens.broadcast_to_tokens`.
    returns: (N, T) float64 regression targets for a value function (GAE), else None.
    stats: metric name (``learn/…``) -> value, e.g. ``learn/groups_zero_std``.
    """

    advantages: np.ndarray
    stats: dict[str, float]
    returns: np.ndarray | None = None


@dataclass(frozen=True)
class TurnBatch:
    """A batch of grouped trajectories, one row per trajectory, one column per turn.

    rewards: (N,) float64, terminal reward beyond step rewards (see the module docstring).
    group: (N,) int64 in [0, G), the group (same task, same snapshot) of each trajectory.
    turn_mask: (N, T) bool, True on real turns; each row is a prefix (turns 0..n_i-1).
    step_rewards: (N, T) float64, per-turn environment rewards; 0 on padding.
    process_rewards: (N, T) float64, weighted and clipped process shaping; 0 on padding.
    state_hash: (N, T) int64, the state each action was taken in (GiGPO anchors, graph).
    action_hash: (N, T) int64, the action taken (graph estimator).
    segment_id: (N, T) int64, sub-goal segment of each turn (0, 1, …; non-decreasing).
    truncated: (N,) bool, the episode was cut off from outside (a budget ran out).
    values: (N, T) float64 value estimates V(s_t) for GAE, or None.
    bootstrap_values: (N,) float64 V(s_T) of the state after each row's last turn (GAE
        bootstraps a truncated row from it), or None.
    state_text: per row, per real turn, the text last seen before acting (similarity
        anchors), or None.
    group_names: G original group ids (``group_names[group[i]]``), may be empty.
    episode_ids: N episode ids, may be empty.
    roles: N role names (``traj.metadata["role"]``, docs/multi-agent.md; "" for a
        single-agent episode), may be empty.
    match_ids: N match ids: the records of one multi-agent episode share one (a single-agent
        record's is its episode id), may be empty.
    env_names: N env names (per-(env, role) baselines), may be empty.
    """

    rewards: np.ndarray
    group: np.ndarray
    turn_mask: np.ndarray
    step_rewards: np.ndarray
    process_rewards: np.ndarray
    state_hash: np.ndarray
    action_hash: np.ndarray
    segment_id: np.ndarray
    truncated: np.ndarray
    values: np.ndarray | None = None
    bootstrap_values: np.ndarray | None = None
    state_text: tuple[tuple[str, ...], ...] | None = None
    group_names: tuple[str, ...] = field(default=())
    episode_ids: tuple[str, ...] = field(default=())
    roles: tuple[str, ...] = field(default=())
    match_ids: tuple[str, ...] = field(default=())
    env_names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        _check(self)

    # -- shape helpers -----------------------------------------------------------------
    @property
    def num_trajectories(self) -> int:
        return int(self.turn_mask.shape[0])

    @property
    def max_turns(self) -> int:
        return int(self.turn_mask.shape[1])

    @property
    def num_groups(self) -> int:
        return int(self.group.max()) + 1 if self.group.size else 0

    @property
    def num_turns(self) -> np.ndarray:
        """(N,) int64, real turns per trajectory."""
        return self.turn_mask.sum(axis=1).astype(np.int64)

    @property
    def scores(self) -> np.ndarray:
        """(N,) episode return with γ = 1: rewards + Σ_t (step + process rewards)."""
        per_turn = np.where(self.turn_mask, self.step_rewards + self.process_rewards, 0.0)
        return self.rewards + per_turn.sum(axis=1)

    def turn_rewards(self) -> np.ndarray:
        """(N, T) reward of each turn: step + process, plus `rewards` on the last real turn."""
        r = np.where(self.turn_mask, self.step_rewards + self.process_rewards, 0.0)
        n = self.num_turns
        rows = np.flatnonzero(n > 0)
        r[rows, n[rows] - 1] += self.rewards[rows]
        return r

    def replace(self, **changes: Any) -> TurnBatch:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def select(self, index: Sequence[int] | np.ndarray) -> TurnBatch:
        """The rows `index` (e.g. a filter's kept indices); groups are renumbered densely."""
        idx = np.asarray(index, dtype=np.int64)
        kept_groups, group = np.unique(self.group[idx], return_inverse=True)
        names = tuple(self.group_names[g] for g in kept_groups) if self.group_names else ()
        return TurnBatch(
            rewards=self.rewards[idx], group=group.astype(np.int64), turn_mask=self.turn_mask[idx],
            step_rewards=self.step_rewards[idx], process_rewards=self.process_rewards[idx],
            state_hash=self.state_hash[idx], action_hash=self.action_hash[idx],
            segment_id=self.segment_id[idx], truncated=self.truncated[idx],
            values=None if self.values is None else self.values[idx],
            bootstrap_values=None if self.bootstrap_values is None else self.bootstrap_values[idx],
            state_text=None if self.state_text is None else tuple(self.state_text[i] for i in idx),
            group_names=names,
            episode_ids=tuple(self.episode_ids[i] for i in idx) if self.episode_ids else (),
            **{k: tuple(getattr(self, k)[i] for i in idx) for k in _ROW_LABELS if getattr(self, k)},
        )

    # -- constructors ------------------------------------------------------------------
    @classmethod
    def build(cls, rewards: Any, group: Any, *, num_turns: Any = None, turn_mask: Any = None,
              step_rewards: Any = None, process_rewards: Any = None, state_hash: Any = None,
              action_hash: Any = None, segment_id: Any = None, truncated: Any = None,
              values: Any = None, bootstrap_values: Any = None,
              max_turns: int | None = None) -> TurnBatch:
        """Build from plain arrays; anything not given gets its neutral default.

        `group` may hold any labels (ints, strings); they are renumbered 0..G-1 in sorted
        order. Give either `num_turns` (N,) or `turn_mask` (N, T); with neither, every row has
        `max_turns` (default 1) turns. Missing hashes default to "every state / action
        distinct" so that no two turns are merged by accident.
        """
        rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
        n = rewards.shape[0]
        labels, dense = np.unique(np.asarray(group).reshape(-1), return_inverse=True)
        if turn_mask is None:
            nt = (np.full(n, max_turns or 1) if num_turns is None
                  else np.asarray(num_turns, dtype=np.int64))
            t = int(max_turns if max_turns is not None else (nt.max() if n else 0))
            if n and (nt.max() > t or nt.min() < 0):
                raise ContractError("batch_turns", f"num_turns must be in [0, max_turns={t}], got "
                                    f"{int(nt.min())}..{int(nt.max())}")
            turn_mask = np.arange(t)[None, :] < nt[:, None]
        turn_mask = np.asarray(turn_mask, dtype=bool)
        shape = turn_mask.shape
        distinct = np.arange(turn_mask.size, dtype=np.int64).reshape(shape)
        return cls(
            rewards=rewards, group=dense.astype(np.int64), turn_mask=turn_mask,
            step_rewards=_arr(step_rewards, shape, np.float64, 0.0),
            process_rewards=_arr(process_rewards, shape, np.float64, 0.0),
            state_hash=distinct if state_hash is None else _arr(state_hash, shape, np.int64, 0),
            action_hash=(-1 - distinct if action_hash is None
                         else _arr(action_hash, shape, np.int64, 0)),
            segment_id=_arr(segment_id, shape, np.int64, 0),
            truncated=_arr(truncated, (n,), bool, False),
            values=None if values is None else _arr(values, shape, np.float64, 0.0),
            bootstrap_values=(None if bootstrap_values is None
                              else _arr(bootstrap_values, (n,), np.float64, 0.0)),
            group_names=tuple(str(x) for x in labels),
        )

    @classmethod
    def from_trajectories(cls, trajs: Sequence[Trajectory], *, state: str = "observation",
                          subgoal_key: str = SUBGOAL_KEY,
                          max_turns: int | None = None) -> TurnBatch:
        """Build the per-turn view of finished trajectories (see `_rows` for each field).

        state: "observation" — the state of turn t is the text the agent saw last before
            acting: the prompt messages for turn 0, else turn t-1's observation (GiGPO's
            anchor state: equal observations are the same state, however reached);
            "history" — the state is the whole history so far (prompt, actions,
            observations; a chain of hashes), so only identical prefixes share a state.
            ``state_text`` always holds the last observation (similarity anchors compare it).
        subgoal_key: a turn ends a sub-goal segment when ``turn.action.get(subgoal_key)`` is
            truthy, or when its index is listed in ``traj.metadata[subgoal_key]``.

        Every trajectory given becomes a row, invalid ones included; a learner leaves those
        out first with `drop_invalid`.
        """
        if state not in ("observation", "history"):
            raise ContractError("batch_state", "state must be 'observation' or 'history', got "
                                               f"{state!r}")
        if not trajs:
            raise ContractError("batch_empty", "no trajectories to build a batch from")
        t_max = max(len(tr.turns) for tr in trajs) if max_turns is None else max_turns
        longest = max(len(tr.turns) for tr in trajs)
        if longest > t_max:
            raise ContractError("batch_turns", f"a trajectory has {longest} turns but "
                                               f"max_turns={t_max}; raise max_turns")
        rows = [_rows(tr, t_max, state, subgoal_key) for tr in trajs]
        labels, dense = np.unique([tr.group_id for tr in trajs], return_inverse=True)
        return cls(
            rewards=np.array([r["final"] for r in rows], dtype=np.float64),
            group=dense.astype(np.int64),
            turn_mask=np.stack([r["mask"] for r in rows]),
            step_rewards=np.stack([r["step"] for r in rows]),
            process_rewards=np.zeros((len(trajs), t_max)),
            state_hash=np.stack([r["state"] for r in rows]),
            action_hash=np.stack([r["action"] for r in rows]),
            segment_id=np.stack([r["segment"] for r in rows]),
            truncated=np.array([tr.truncated for tr in trajs], dtype=bool),
            state_text=tuple(r["state_text"] for r in rows),
            group_names=tuple(str(x) for x in labels),
            episode_ids=tuple(tr.episode_id for tr in trajs),
            roles=tuple(str(tr.metadata.get("role") or "") for tr in trajs),
            match_ids=tuple(str(tr.metadata.get("match_id") or tr.episode_id) for tr in trajs),
            env_names=tuple(tr.env_name for tr in trajs),
        )


def drop_invalid(trajs: Sequence[Trajectory]) -> tuple[list[Trajectory], int]:
    """The valid trajectories of `trajs` (order kept) and how many invalid ones were left out.

    ``Trajectory.valid`` is False when an error, not the agent, ended the episode (a tool or
    retriever failure, an engine crash). Its reward measures the failure, not the policy, so
    it must never reach the loss. Call this *before* `TurnBatch.from_trajectories`: group
    estimators then compare the valid members of each group only, and a tool failure is not
    counted as a 0-reward rollout that pushes its siblings' advantages up.
    """
    kept = [t for t in trajs if t.valid]
    return kept, len(trajs) - len(kept)


def prompt_text(traj: Trajectory) -> str:
    """The messages before the first assistant message, as one text (the turn-0 state)."""
    out = []
    for m in traj.messages:
        if m.get("role") == "assistant":
            break
        out.append(f"{m.get('role', '')}: {m.get('content', '')}")
    return "\n".join(out)


def _rows(tr: Trajectory, t_max: int, state: str, subgoal_key: str) -> dict[str, Any]:
    n = len(tr.turns)
    mask = np.arange(t_max) < n
    step = np.zeros(t_max)
    states = np.zeros(t_max, dtype=np.int64)
    actions = np.zeros(t_max, dtype=np.int64)
    segment = np.zeros(t_max, dtype=np.int64)
    texts = []
    listed = {int(x) for x in (tr.metadata.get(subgoal_key) or [])}
    seen, seg = prompt_text(tr), 0
    history = stable_hash(seen)
    for t, turn in enumerate(tr.turns):
        texts.append(seen)
        # "history" chains hashes (never a growing string): equal iff the whole past is equal
        states[t] = stable_hash(seen) if state == "observation" else history
        actions[t] = stable_hash(turn.action_text)
        step[t] = turn.env_reward
        segment[t] = seg
        # the boundary turn closes its segment: the next turn opens a new one
        seg += bool(turn.action.get(subgoal_key)) or turn.index in listed or t in listed
        seen = turn.observation_text
        history = stable_hash(f"{history}\x00{actions[t]}\x00{seen}")
    final = tr.reward - float(step.sum())  # reward no turn carries
    if n:
        moved = outcome_on_last_turn(tr)
        step[n - 1] -= moved
        final += moved
    return {"mask": mask, "step": step, "state": states, "action": actions, "segment": segment,
            "state_text": tuple(texts), "final": final}


def outcome_on_last_turn(tr: Trajectory) -> float:
    """How much of the last turn's step reward is the episode's outcome.

    ``reward_components`` are the final step's reward, layer by layer (`taurl.envs.core.StepInfo`):
    with other layers beside ``outcome`` (constraints, shaping, earlier ``env_steps``) the
    outcome is ``reward_components["outcome"]``; with ``outcome`` alone (or no components:
    the rollout then names the whole reward outcome) it is the final step's reward, which is
    where the outcome arrives.
    """
    comps = tr.reward_components
    if "outcome" in comps and len(comps) > 1:
        return float(comps["outcome"])
    return float(tr.turns[-1].env_reward) if tr.turns else 0.0


def _arr(x: Any, shape: tuple[int, ...], dtype: Any, fill: Any) -> np.ndarray:
    if x is None:
        return np.full(shape, fill, dtype=dtype)
    return np.asarray(x, dtype=dtype)


def _check(b: TurnBatch) -> None:
    """Validate shapes, dtypes and masks once, where the batch is made; freeze the arrays."""
    if b.turn_mask.ndim != 2:
        raise ContractError("batch_shape", "turn_mask must be (N, T), got shape "
                                           f"{b.turn_mask.shape}")
    n, t = b.turn_mask.shape
    expect = {"rewards": (n,), "group": (n,), "truncated": (n,), "step_rewards": (n, t),
              "process_rewards": (n, t), "state_hash": (n, t), "action_hash": (n, t),
              "segment_id": (n, t)}
    if b.values is not None:
        expect["values"] = (n, t)
    if b.bootstrap_values is not None:
        expect["bootstrap_values"] = (n,)
    for name, shape in expect.items():
        arr = getattr(b, name)
        if not isinstance(arr, np.ndarray) or arr.shape != shape:
            got = getattr(arr, "shape", type(arr).__name__)
            raise ContractError("batch_shape", f"{name} must have shape {shape} (N={n}, T={t}), "
                                               f"got {got}")
    if b.turn_mask.dtype != bool or b.truncated.dtype != bool:
        raise ContractError("batch_dtype", "turn_mask and truncated must be bool arrays; use "
                                           "TurnBatch.build")
    for name in ("group", "state_hash", "action_hash", "segment_id"):
        if getattr(b, name).dtype != np.int64:
            raise ContractError("batch_dtype", f"{name} must be int64; use TurnBatch.build to "
                                               "convert")
    if n and (b.group.min() < 0):
        raise ContractError("batch_group", "group ids must be >= 0; use TurnBatch.build to "
                                           "renumber labels")
    if t > 1 and np.any(b.turn_mask[:, 1:] & ~b.turn_mask[:, :-1]):
        raise ContractError("batch_mask", "each row of turn_mask must be a prefix (turns 0..n-1 "
                                          "real, then padding)")
    optional = tuple(k for k in ("values", "bootstrap_values") if getattr(b, k) is not None)
    for name in ("rewards", "step_rewards", "process_rewards") + optional:
        if not np.all(np.isfinite(getattr(b, name))):
            raise ContractError("batch_finite", f"{name} has NaN or inf; fix the reward or value "
                                                "source")
    if t > 1 and np.any(np.diff(b.segment_id, axis=1)[b.turn_mask[:, 1:]] < 0):
        raise ContractError("batch_segments", "segment_id must not decrease along a trajectory")
    if b.state_text is not None:
        counts = b.turn_mask.sum(axis=1)
        if len(b.state_text) != n or any(len(s) != c
                                         for s, c in zip(b.state_text, counts, strict=True)):
            raise ContractError("batch_shape", "state_text must hold one text per real turn of "
                                               "each row")
    for name in ("episode_ids", *_ROW_LABELS):
        labels = getattr(b, name)
        if labels and len(labels) != n:
            raise ContractError("batch_shape", f"{name} has {len(labels)} entries for {n} rows")
    for f in dataclasses.fields(b):
        v = getattr(b, f.name)
        if isinstance(v, np.ndarray):
            # records are immutable once written: a read-only view, the caller's array untouched
            view = v.view()
            view.flags.writeable = False
            object.__setattr__(b, f.name, view)
