"""Trajectory records and their validation: the contracts of docs/design.md#contracts.

A trajectory τ = (s0, a0, o1, a1, …, aT) is stored as a flat token stream cut into
*segments*. Each segment has one kind:

=============  =========================================  ====  ==========  =========
kind           where the ids come from                    mask  logprobs    version
=============  =========================================  ====  ==========  =========
prompt         the chat template, rendered once            0     none        none
action         exactly the ids the engine sampled          1     behaviour   required
observation    the environment's answer, encoded once      0     none        none
template       end-of-turn tokens the template adds        0     none        none
=============  =========================================  ====  ==========  =========

Only `action` ids are trained on (mask 1). Behaviour logprobs are
``log_softmax(logits / temperature)`` of the policy that sampled the token, before any
top-p truncation — the same quantity the learner recomputes. ``metadata["sampling"]``
records how the actions were drawn (``temperature``, ``top_p``). With ``top_p < 1`` the
tokens were drawn from the renormalized nucleus, whose probability the stored logprobs are
not (and the per-token nucleus mass that would correct them is not kept), so
`behaviour_logprobs` refuses such a record: its importance ratio would be biased. It is
still fine for SFT, evaluation and export.

`source` says who produced the actions. ``"policy"`` (the default): an engine sampled
them, and every action segment carries its behaviour logprobs and policy version. Any
other snake_case name (``"expert"``, ``"scripted"``, ``"human"``): no policy sampled
them, so action segments carry *no* logprobs and *no* version (``None``) — a made-up
logprob would enter an importance ratio as if a policy had produced it. Such records
are for supervised learning (token ids and masks) only; `behaviour_logprobs` refuses them.

`terminated` and `truncated` follow Gymnasium: *terminated* means the episode reached
a terminal state of the task (the agent answered, reached a goal, ended its turn);
*truncated* means it was cut off from outside (turn, token, context or tool budgets, an
error, a fall). Exactly one of them is true for a finished episode, and `stop_reason`
says why. Stop reasons are an open set (`StopReason`): the loop's own eight have a fixed
kind; an environment may report any other snake_case reason, whose kind is the flag the
env set — the record keeps both the reason and the flags.

`provenance` is what the env reported at reset about the world it ran (a corpus
fingerprint, a map seed, a snapshot id): a JSON object, kept as given.

An episode is a *chain* of token streams (docs/long_horizons.md). Most episodes are one
stream: the prompt, then actions and observations appended. When the context is compacted,
or a chat template rewrites history, the next prompt no longer extends the stream: a new
stream begins with a new ``prompt`` segment, rendered once, and `stream_starts` records where
(its segment and its first message) and why (`StreamStart.reason`). Each stream is
token-exact on its own; the flat views (`token_ids`, ...) concatenate the streams, and
`taurl.data.chains.stream_views` splits them again. A one-stream episode is a chain of one
(``stream_starts == ()``).

Records are immutable. `to_dict` / `from_dict` give the JSON form stored in the ledger
and written by the JSONL export.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from taurl.data.json_fields import _NUM, _fields, _is, _num_map, _spec
from taurl.data.plain import plain_asdict
from taurl.data.stop_reason import NAME_PATTERN, StopReason
from taurl.data.streams import StreamStart, stream_problems
from taurl.errors import ContractError

SEGMENT_KINDS = ("prompt", "action", "observation", "template")
INT32_MAX = 2**31 - 1  # token ids and policy versions are exported as int32


POLICY_SOURCE = "policy"  # `Trajectory.source` of records an engine sampled


def sampling_record(temperature: float, top_p: float) -> dict[str, float]:
    """``metadata["sampling"]`` of a record: how its actions were drawn (module docstring)."""
    return {"temperature": float(temperature), "top_p": float(top_p)}


@dataclass(frozen=True)
class Segment:
    """A run of token ids of one kind.

    token_ids: (n,) vocabulary ids. logprobs: (n,) behaviour logprobs, action only.
    policy_version: the policy version that sampled the ids, action only.
    Both are None on every segment of a record no policy sampled (`Trajectory.source`).
    """

    kind: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    policy_version: int | None = None

    @property
    def mask(self) -> int:
        return 1 if self.kind == "action" else 0


@dataclass(frozen=True)
class ToolReceipt:
    """What happened to one tool call: the gate's decision, the execution, the result."""

    tool: str
    arguments: dict[str, Any]
    decision: str  # "allowed" | "denied"
    status: str  # "ok" | "error" | "timeout" | "denied"
    reason: str = ""  # why it was denied or failed, in words
    latency_s: float = 0.0
    output_chars: int = 0
    truncated_output: bool = False


@dataclass(frozen=True)
class Turn:
    """One action of the agent and the environment's answer to it.

    action: the parsed action as a JSON-able dict (env-specific; always has "kind").
    action_segment / observation_segment: indexes into `Trajectory.segments`.
    action_text: as sampled, a sampled EOS included; env_text: what env.step was given when
    that differs (the EOS cut), else None. A replay reads `taurl.envs.core.seen_by_env`.
    """

    index: int  # its position in the episode's turns (a compaction's summary is a turn too)
    action_text: str
    action: dict[str, Any]
    observation_text: str
    action_segment: int
    observation_segment: int | None
    finish_reason: str  # the engine's: "stop" | "length" | "eos"
    invalid: bool = False  # the action could not be parsed / was not allowed
    error: str | None = None  # an environment or tool failure, in words
    receipt: ToolReceipt | None = None
    env_reward: float = 0.0
    generate_s: float = 0.0
    env_s: float = 0.0
    observation_tokens_dropped: int = 0  # ids cut from the observation (token budget)
    env_text: str | None = None  # what env.step was given, when not action_text (EOS cut)


@dataclass(frozen=True)
class Trajectory:
    """One finished episode: identity, the token stream, the turns and how it ended.

    source: who produced the actions — "policy" (sampled, with behaviour logprobs and
    versions) or another snake_case name ("expert", "scripted": no logprobs, no versions).
    provenance: what the env reported at reset about its world (JSON object).
    """

    episode_id: str
    run_id: str
    task_id: str
    group_id: str
    split: str
    env_name: str
    env_version: str
    seed: int
    segments: tuple[Segment, ...]
    turns: tuple[Turn, ...]
    messages: tuple[dict[str, str], ...]  # the chat the token stream renders (each stream its part)
    terminated: bool
    truncated: bool
    stop_reason: StopReason | None
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    verifier_version: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = POLICY_SOURCE
    provenance: dict[str, Any] = field(default_factory=dict)
    stream_starts: tuple[StreamStart, ...] = ()  # where each stream after the first begins

    def __post_init__(self) -> None:
        # a plain string names the same reason; an unreadable one is left for check_trajectory
        r = self.stop_reason
        if isinstance(r, str) and not isinstance(r, StopReason) and NAME_PATTERN.match(r):
            object.__setattr__(self, "stop_reason", StopReason(r))

    # -- the flat views the learner and the export use -------------------------------
    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def action_mask(self) -> list[int]:
        return [s.mask for s in self.segments for _ in s.token_ids]

    @property
    def has_behaviour_policy(self) -> bool:
        """True when a policy sampled the actions (source "policy"): behaviour logprobs exist."""
        return self.source == POLICY_SOURCE

    @property
    def logprobs(self) -> list[float]:
        """The padded tensor view: behaviour logprobs aligned with `token_ids`, 0.0 where the
        mask is 0 — and 0.0 everywhere for a record no policy sampled, whose actions have no
        behaviour logprob. Anything that forms an importance ratio reads `behaviour_logprobs`."""
        out: list[float] = []
        for s in self.segments:
            out.extend(s.logprobs if s.kind == "action" and s.logprobs
                       else [0.0] * len(s.token_ids))
        return out

    @property
    def behaviour_logprobs(self) -> list[float]:
        """`logprobs`, for a record a policy sampled; raises ContractError(rule=
        "behaviour_without_policy") for one no policy sampled (an expert demonstration):
        its actions have no behaviour logprob, so it must never enter a PPO/IS ratio."""
        if not self.has_behaviour_policy:
            raise ContractError("behaviour_without_policy", f"episode {self.episode_id!r} has "
                                                            "source "
                                f"{self.source!r}: no policy sampled its actions, so it has no "
                                "behaviour logprobs; train on it with SFT, or leave it out of the "
                                "RL batch")
        top_p = (self.metadata.get("sampling") or {}).get("top_p", 1.0)
        if isinstance(top_p, (int, float)) and top_p < 1:
            raise ContractError("behaviour_top_p", f"episode {self.episode_id!r} was sampled with "
                                                   f"top_p={top_p:g}: "
                                "its tokens came from the renormalized nucleus, its stored "
                                "logprobs are the full distribution's, so an importance ratio over "
                                "them is biased; sample RL rollouts with top_p 1 (temperature "
                                "still applies), or train on this record with SFT")
        return self.logprobs

    @property
    def token_versions(self) -> list[int]:
        """Policy version of each token; -1 where no policy sampled it (mask 0, or a record
        whose source is not "policy")."""
        out: list[int] = []
        for s in self.segments:
            v = s.policy_version if s.kind == "action" and s.policy_version is not None else -1
            out.extend([v] * len(s.token_ids))
        return out

    @property
    def policy_versions(self) -> list[int]:
        """Sorted distinct versions that produced this trajectory's actions."""
        return sorted({s.policy_version for s in self.segments
                       if s.kind == "action" and s.policy_version is not None})

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    @property
    def num_action_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.kind == "action")

    @property
    def num_streams(self) -> int:
        """Token streams in the chain (1 for an episode that was never compacted)."""
        return 1 + len(self.stream_starts)

    @property
    def num_tool_calls(self) -> int:
        return sum(1 for t in self.turns if t.receipt is not None)

    @property
    def num_invalid_actions(self) -> int:
        return sum(1 for t in self.turns if t.invalid)

    @property
    def num_errors(self) -> int:
        return sum(1 for t in self.turns if t.error)

    @property
    def valid(self) -> bool:
        """The valid-sample flag: false when an error (not the agent) ended the episode."""
        return self.stop_reason != StopReason.ERROR

    # -- JSON form -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = plain_asdict(self)
        d["stop_reason"] = (str.__str__(self.stop_reason) if isinstance(self.stop_reason, str)
                            else self.stop_reason)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Trajectory:
        """Build from the JSON form; raises ContractError(rule="schema") on bad structure."""
        return _from_dict(d)


# ---------------------------------------------------------------------------------------
# Validation: each rule has a stable name; `check_trajectory` lists every violation.


# Over 60 lines on purpose: one block per named contract rule, in the order of the rules table
# (taurl.data.admission.RULES); a flat list is how the rules are audited.
def check_trajectory(traj: Trajectory) -> list[ContractError]:
    """Every contract rule `traj` breaks, as ContractErrors (empty when valid)."""
    errs: list[ContractError] = []

    def bad(rule: str, detail: str) -> None:
        errs.append(ContractError(rule, detail))

    for name in ("episode_id", "task_id", "group_id", "split", "env_name", "env_version"):
        if not getattr(traj, name):
            bad("missing_identity", f"{name} is empty; every trajectory names its episode, task, "
                                    "group, split and env")
    if not _is(traj.seed, int) or not -(2**63) <= traj.seed < 2**63:
        bad("seed_range", f"seed {traj.seed!r} must be an integer that fits in int64")
    policy = traj.source == POLICY_SOURCE
    if not isinstance(traj.source, str) or not NAME_PATTERN.match(traj.source):
        bad("source_name", f"source {traj.source!r} must be {POLICY_SOURCE!r} or another "
                           "snake_case name "
            "('expert', 'scripted', ...) saying who produced the actions")
    if not traj.segments:
        bad("empty_trajectory", "a trajectory has no segments")
    elif traj.segments[0].kind != "prompt":
        bad("prompt_first",
            f"the first segment is {traj.segments[0].kind!r}; it must be the prompt")
    for i, s in enumerate(traj.segments):
        where = f"segment {i} ({s.kind})"
        if s.kind not in SEGMENT_KINDS:
            bad("segment_kind", f"{where}: kind must be one of {SEGMENT_KINDS}")
            continue
        if len(s.token_ids) == 0 and s.kind != "action":
            bad("empty_segment", f"{where} has no tokens")
        if any(not _is(t, int) or not 0 <= t <= INT32_MAX for t in s.token_ids):
            bad("token_range", f"{where}: token ids must be integers in [0, 2**31)")
        if s.kind == "action" and not policy:
            if s.logprobs is not None or s.policy_version is not None:
                bad("behaviour_without_policy", f"{where}: source is {traj.source!r}, so no policy "
                                                "sampled these "
                    "ids; a logprob or policy version here would be made up — leave both None")
        elif s.kind == "action":
            if s.logprobs is None or len(s.logprobs) != len(s.token_ids):
                n = None if s.logprobs is None else len(s.logprobs)
                bad("logprobs_length", f"{where}: {len(s.token_ids)} ids but {n} logprobs (a "
                                       "record no policy "
                    "sampled says so with source='expert' or another name, and carries none)")
            elif any((not math.isfinite(x)) or x > 1e-6 for x in s.logprobs):
                bad("logprob_range", f"{where}: logprobs must be finite and <= 0")
            if s.policy_version is None:
                bad("action_without_version", f"{where}: every action segment records the policy "
                                              "version that sampled it")
            elif not _is(s.policy_version, int) or not 0 <= s.policy_version <= INT32_MAX:
                # -1 means "no version" in the flat `token_versions` view, so versions are >= 0
                bad("version_range", f"{where}: policy_version {s.policy_version!r} must be an "
                                     "integer in [0, 2**31)")
        elif s.logprobs is not None or s.policy_version is not None:
            bad("non_action_logprobs", f"{where}: only action segments carry logprobs and a policy "
                                       "version")
    errs.extend(ContractError("stream_start", d) for d in stream_problems(traj))
    for t in traj.turns:
        if (not 0 <= t.action_segment < len(traj.segments)
            or traj.segments[t.action_segment].kind != "action"):
            bad("turn_segment", f"turn {t.index}: action_segment {t.action_segment} is not an "
                                "action segment")
        o = t.observation_segment
        if o is not None and (not 0 <= o < len(traj.segments)
                              or traj.segments[o].kind != "observation"):
            bad("turn_segment", f"turn {t.index}: observation_segment {o} is not an observation "
                                "segment")
    reason = traj.stop_reason
    if reason is None:
        bad("missing_stop_reason", "a finished episode records why it stopped")
    elif not isinstance(reason, StopReason):  # __post_init__ converts every well-formed name
        bad("stop_reason_name", f"stop_reason {reason!r} is not a snake_case name (e.g. "
                                "'answered', 'goal')")
    elif traj.terminated == traj.truncated:
        bad("termination_flags", "exactly one of terminated/truncated must be true (got "
                                 f"{traj.terminated}/{traj.truncated})")
    elif reason.kind is not None and traj.terminated != reason.is_termination:
        bad("termination_flags", f"stop_reason {reason.value!r} is one of the loop's "
                                 f"{reason.kind}s "
            f"but terminated={traj.terminated}; an env's own reason needs its own name")
    if not math.isfinite(traj.reward):
        bad("reward_finite", f"reward {traj.reward} is not finite")
    if traj.reward_components:
        total = sum(traj.reward_components.values())
        if not math.isclose(total, traj.reward, rel_tol=1e-6, abs_tol=1e-6):
            bad("reward_components_sum", f"reward {traj.reward} != sum of components {total}")
        if not traj.verifier_version:
            bad("missing_verifier_version", "a reward from a verifier records the verifier's "
                                            "version")
    return errs


def validate_trajectory(traj: Trajectory) -> Trajectory:
    """Return `traj` if it keeps every contract, else raise the first broken rule."""
    errs = check_trajectory(traj)
    if errs:
        if len(errs) > 1:
            more = "; ".join(str(e) for e in errs[1:])
            raise ContractError(errs[0].rule, f"{errs[0].detail} (also: {more})")
        raise errs[0]
    return traj


# ---------------------------------------------------------------------------------------
# from_dict: structural checks (`taurl.data.json_fields`); semantics are checked above.


def _segment(s: Any, i: int) -> Segment:
    kw = _fields(s, _spec(Segment), f"segment {i}")
    lps = kw.get("logprobs")
    if lps is not None and not all(_is(x, _NUM) for x in lps):
        raise ContractError("schema", f"segment {i}: logprobs must be a list of numbers or null")
    return Segment(kw["kind"], tuple(kw["token_ids"]),
                   None if lps is None else tuple(float(x) for x in lps), kw.get("policy_version"))


def _turn(t: Any, i: int) -> Turn:
    kw = _fields(t, _spec(Turn), f"turn {i}")
    rec = kw.pop("receipt", None)
    if rec is not None:
        kw["receipt"] = ToolReceipt(**_fields(rec, _spec(ToolReceipt), f"turn {i} receipt"))
    return Turn(**kw)


def _from_dict(d: Any) -> Trajectory:
    try:
        return _from_dict_checked(d)
    except ContractError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError) as e:
        # a safety net: whatever the structure, the caller gets a ContractError
        raise ContractError("schema", f"malformed trajectory ({type(e).__name__}: {e})") from None


def _from_dict_checked(d: Any) -> Trajectory:
    if not isinstance(d, dict):
        raise ContractError("schema", f"a trajectory is a JSON object, got {type(d).__name__}")
    where = "trajectory"
    spec = dict(_spec(Trajectory))
    # older records may lack these; a missing stop_reason is then reported by its own rule
    spec["run_id"] = ((str,), False)
    spec["stop_reason"] = ((str, type(None)), False)
    spec["reward"] = (_NUM, True)  # an unscored episode says reward 0 explicitly
    # other keys (the export's flat arrays, counts) are not the record's: the ledger checks them
    kw = _fields({k: v for k, v in d.items() if k in spec}, spec, where)
    kw["run_id"] = kw.get("run_id", "")
    kw["segments"] = tuple(_segment(s, i) for i, s in enumerate(kw["segments"]))
    kw["turns"] = tuple(_turn(t, i) for i, t in enumerate(kw["turns"]))
    kw["stream_starts"] = tuple(StreamStart(**_fields(s, _spec(StreamStart), f"stream_starts[{i}]"))
                                for i, s in enumerate(kw.get("stream_starts", ())))
    for i, m in enumerate(kw["messages"]):
        if not isinstance(m, dict) or not all(isinstance(k, str) for k in m):
            raise ContractError("schema", f"message {i} must be a JSON object with string keys")
    kw["messages"] = tuple(kw["messages"])
    # stop_reason: a well-formed name becomes a StopReason in __post_init__; check_trajectory names
    # the rest
    kw["stop_reason"] = kw.get("stop_reason")
    kw["reward"] = float(kw["reward"])
    kw["reward_components"] = _num_map(d, "reward_components", where)
    kw["timings"] = _num_map(d, "timings", where)
    return Trajectory(**kw)
