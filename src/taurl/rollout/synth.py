"""SFT data: expert demonstrations through the real agent loop, and rejection sampling.

Demonstrations (`demonstrations`): any env's `taurl.envs.spec.Expert` (``expert(task, rng,
**options) -> action strings``) acts through `ScriptedEngine`, an Engine whose "sampling"
encodes the expert's text, so demonstrations are built by the very same token-exact loop
as rollouts: same prompt rendering, same observation encoding, same masks. They are
recorded honestly: no policy sampled them, so the trajectory says ``source = "expert"``
and its action segments carry no behaviour logprobs and no policy version (None) — they
train SFT (token ids and mask) and can never enter a PPO ratio
(`Trajectory.behaviour_logprobs` refuses them). search-v0's expert and its quality knobs
live in `taurl.envs.search.expert`.

Synthesis (`rejection_sample`): sample k episodes per task from a policy, keep those the
verifier accepts and pass the quality filters (`SynthFilters`):

* efficiency — at most ``hops + max_extra_tool_calls`` tool calls;
* completeness — every turn has a thought (``<think>…</think>``) and a valid action,
  every turn but the last got an observation, and the last one answered;
* diversity — among kept episodes of one task, the action-sequence Jaccard similarity
  |A ∩ B| / |A ∪ B| (A, B: the sets of normalized actions) stays <= ``max_jaccard``;
* difficulty buckets — each task is bucketed by its success rate over the k samples
  (easy >= 2/3 > medium >= 1/3 > hard > 0 = unsolved); ``max_easy_fraction`` caps the
  share of kept episodes from easy tasks.

These are policy samples (``source = "policy"``, with their behaviour logprobs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from taurl.data.trajectory import NAME_PATTERN, Trajectory
from taurl.envs.core import Env, Task, episode_env
from taurl.envs.spec import Expert
from taurl.errors import ConfigError
from taurl.policy.protocol import Engine, Generation, SamplingParams
from taurl.reward.exact_match import normalize_answer
from taurl.rollout.loop import RolloutConfig, run_episode

EXPERT_SOURCE = "expert"


class ScriptedEngine:
    """An Engine that plays a fixed list of action strings, one per call.

    Each action is encoded once with the policy's tokenizer; when the list runs out the
    engine ends the turn with EOS. It serves one episode. It is not a policy: `source`
    ("scripted" unless told, "expert" for demonstrations) tells the loop so, and the loop
    records its actions without logprobs or version. (Its `Generation` still fills the
    fields the Engine protocol requires — logprob 0.0, version 0 — which the loop drops.)

    ``eos_each=True`` ends every action with EOS (cut to leave room for it), as a chat
    model ends its turn: the proxy's expert replies (`taurl.proxy.experts.ReplyEngine`).
    """

    def __init__(self, tokenizer, actions: Sequence[str], max_context: int = 2048,
                 source: str = "scripted", eos_each: bool = False):
        if source == "policy" or not NAME_PATTERN.match(source):
            raise ConfigError(f"source {source!r} must be a snake_case name other than 'policy' "
                              "(a script is not a policy), e.g. 'scripted' or 'expert'")
        self.tokenizer = tokenizer
        self.actions = list(actions)
        self.source = source
        self.eos_each = eos_each
        self._max_context = max_context
        self._calls = 0

    @property
    def version(self) -> int:
        return 0

    @property
    def max_context(self) -> int:
        return self._max_context

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        text = self.actions[self._calls] if self._calls < len(self.actions) else None
        self._calls += 1
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
        if text is None or self.eos_each:  # the turn ends: EOS, after as much of the text as fits
            ids, reason = (ids[:max(0, sampling.max_tokens - 1)] + [self.tokenizer.eos_token_id],
                           "eos")
        else:
            ids, reason = ids[:sampling.max_tokens], "stop"
        return Generation(ids, [0.0] * len(ids), reason, 0, prompt_tokens=len(prompt_ids))


async def demonstrations(tasks: Sequence[Task], tokenizer, make_env: Callable[[], Env], *,
                         expert: Expert | None = None,
                         expert_options: Mapping[str, Any] | None = None,
                         seed: int = 0, run_id: str = "", config: RolloutConfig | None = None,
                         episode_prefix: str = "demo", quality: Any = None,
                         concurrency: int = 16) -> list[Trajectory]:
    """One `expert` episode per task, through the real agent loop (`run_episode`).

    Up to `concurrency` episodes run at once (their envs' `astep` awaits tools and sandbox
    runs, so one episode's test run does not hold up the others); the result is in task
    order and equals the sequential one (``concurrency=1``) record for record, timings aside.

    The expert is called as ``expert(task, random.Random(f"{seed}:{i}"), **expert_options)``
    for the i-th task, so the demonstrations are deterministic in `seed`. Episode ids are
    ``{episode_prefix}-{i}`` (deterministic, so a restarted run finds the ones it stored).
    Each record has ``source = "expert"``, no logprobs and no policy version on its actions,
    and ``metadata["expert"]`` / ``metadata["expert_options"]`` naming what produced it.

    `quality` (a `taurl.envs.search.expert.ExpertQuality`) is the earlier search-only
    form: without `expert` it means ``expert=search_expert, expert_options=quality.options()``.
    """
    if expert is None and quality is not None:  # the earlier, search-only call
        from taurl.envs.search.expert import search_expert

        expert, expert_options = search_expert, {**quality.options(), **(expert_options or {})}
    if expert is None or not callable(expert):
        raise ConfigError("demonstrations needs expert=: a callable expert(task, rng, **options) "
                          "-> action strings (taurl.envs.spec.Expert), e.g. the one the env "
                          "registered")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be an int >= 1, got {concurrency!r}")
    options = dict(expert_options or {})
    name = getattr(expert, "__name__", type(expert).__name__)
    # the expert runs on the host first, in task order: its draws do not depend on timing
    scripts = []
    for i, task in enumerate(tasks):
        actions = expert(task, random.Random(f"{seed}:{i}"), **options)
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise ConfigError(f"expert {name} returned {type(actions).__name__} for task "
                              f"{task.task_id!r}; an Expert returns a list of action strings, one "
                              "per turn")
        scripts.append(actions)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, task: Task, actions: list[str]) -> Trajectory:
        async with sem:  # each episode has its own env (and sandbox) and its own scripted engine
            engine = ScriptedEngine(tokenizer, actions, source=EXPERT_SOURCE)
            with episode_env(make_env) as env:  # closed after the episode (taurl.envs.core)
                traj = await run_episode(engine, env, tokenizer, task, seed=seed + i,
                                         config=config or RolloutConfig(),
                                         group_id=f"{episode_prefix}:{task.task_id}",
                                         run_id=run_id, episode_id=f"{episode_prefix}-{i}")
        return _with_metadata(traj, expert=name, expert_options=options)

    # gather keeps task order whatever order the episodes finish in
    return list(await asyncio.gather(
        *(one(i, t, a) for i, (t, a) in enumerate(zip(tasks, scripts, strict=True)))))


def _with_metadata(traj: Trajectory, **extra: Any) -> Trajectory:
    return dataclasses.replace(traj, metadata={**traj.metadata, **extra})


def __getattr__(name: str) -> Any:
    # the search expert moved to taurl.envs.search.expert; imported lazily so that this
    # generic module does not load the search env (its corpus and index) for other envs
    if name in ("expert_actions", "ExpertQuality", "search_expert"):
        from taurl.envs.search import expert as search

        return getattr(search, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------
# Rejection-sampling synthesis with quality filters (module docstring)


@dataclass(frozen=True)
class SynthFilters:
    """Which sampled episodes become demonstrations."""

    min_reward: float = 1.0  # the verifier's reward an episode needs (rejection sampling)
    max_extra_tool_calls: int = 1  # efficiency: at most hops + this many tool calls
    # completeness: thought + valid action every turn, observation, final answer
    require_complete: bool = True
    # diversity: max action-sequence Jaccard between kept episodes of one task
    max_jaccard: float = 0.8
    per_task: int = 2  # at most this many kept episodes per task
    max_easy_fraction: float = 1.0  # cap on the share of kept episodes from easy tasks

    def problems(self) -> list[str]:
        out = []
        if not 0 <= self.max_jaccard <= 1:
            out.append(f"max_jaccard must be in [0, 1] (got {self.max_jaccard})")
        if not 0 < self.max_easy_fraction <= 1:
            out.append(f"max_easy_fraction must be in (0, 1] (got {self.max_easy_fraction})")
        if self.per_task < 1 or self.max_extra_tool_calls < 0:
            out.append("per_task must be >= 1 and max_extra_tool_calls >= 0")
        return out


_THINK = re.compile(r"<think>.+?</think>", re.DOTALL)


def action_sequence(traj: Trajectory) -> tuple[str, ...]:
    """The episode's actions, normalized: ``("search:rockville", "answer:united states")``."""
    out = []
    for t in traj.turns:
        kind = t.action.get("kind", "unknown")
        arg = t.action.get("query", t.action.get("answer", ""))
        out.append(f"{kind}:{normalize_answer(str(arg))}")
    return tuple(out)


def jaccard(a: Sequence[str], b: Sequence[str]) -> float:
    """|A ∩ B| / |A ∪ B| of the two action sets (1.0 for two empty sequences).

    >>> jaccard(["search:a", "answer:x"], ["search:b", "answer:x"])
    0.3333333333333333
    """
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def is_complete(traj: Trajectory) -> bool:
    """Every turn thinks and acts validly, every non-final turn was answered, the last one
    answers."""
    if not traj.turns or not traj.terminated or traj.turns[-1].action.get("kind") != "answer":
        return False
    for i, t in enumerate(traj.turns):
        if t.invalid or not _THINK.search(t.action_text):
            return False
        if i < len(traj.turns) - 1 and not t.observation_text:
            return False
    return True


def is_efficient(traj: Trajectory, hops: int, max_extra: int) -> bool:
    return traj.num_tool_calls <= hops + max_extra


def difficulty_bucket(success_rate: float) -> str:
    """easy (>= 2/3), medium (>= 1/3), hard (> 0), unsolved (0)."""
    if success_rate >= 2 / 3:
        return "easy"
    if success_rate >= 1 / 3:
        return "medium"
    return "hard" if success_rate > 0 else "unsolved"


@dataclass(frozen=True)
class SynthResult:
    kept: list[Trajectory]
    stats: dict[str, float]  # synth/* counts of each filter and bucket


def select_demonstrations(trajs: Sequence[Trajectory], tasks: Sequence[Task],
                          filters: SynthFilters = SynthFilters()) -> SynthResult:
    """Apply the rejection threshold and the quality filters (module docstring) to sampled
    episodes."""
    if problems := filters.problems():
        raise ConfigError(problems)
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(t)
    hops = {t.task_id: int(t.metadata.get("hops", 1)) for t in tasks}
    stats: Counter[str] = Counter()
    kept_by_bucket: dict[str, list[Trajectory]] = defaultdict(list)
    for task_id, eps in by_task.items():
        rate = sum(e.reward >= filters.min_reward for e in eps) / len(eps)
        bucket = difficulty_bucket(rate)
        stats[f"synth/tasks_{bucket}"] += 1
        kept: list[Trajectory] = []
        for e in eps:
            if e.reward < filters.min_reward:
                stats["synth/rejected_reward"] += 1
            elif filters.require_complete and not is_complete(e):
                stats["synth/rejected_incomplete"] += 1
            elif not is_efficient(e, hops.get(task_id, 1), filters.max_extra_tool_calls):
                stats["synth/rejected_inefficient"] += 1
            elif any(jaccard(action_sequence(e), action_sequence(k)) > filters.max_jaccard
                     for k in kept):
                stats["synth/rejected_duplicate"] += 1
            elif len(kept) >= filters.per_task:
                stats["synth/rejected_per_task"] += 1
            else:
                kept.append(e)
        kept_by_bucket[bucket].extend(kept)
    others = sum(len(v) for b, v in kept_by_bucket.items() if b != "easy")
    easy = kept_by_bucket.get("easy", [])
    if filters.max_easy_fraction < 1 and easy:
        # easy share e / (e + others) <= f  <=>  e <= f·others / (1 − f)
        cap = int(filters.max_easy_fraction * others / (1 - filters.max_easy_fraction))
        stats["synth/rejected_easy_cap"] += max(0, len(easy) - cap)
        kept_by_bucket["easy"] = easy[:cap]
    out = [e for b in ("easy", "medium", "hard", "unsolved") for e in kept_by_bucket.get(b, [])]
    stats["synth/sampled"] = len(trajs)
    stats["synth/kept"] = len(out)
    for b in ("easy", "medium", "hard"):
        stats[f"synth/kept_{b}"] = len(kept_by_bucket.get(b, []))
    return SynthResult(out, {k: float(v) for k, v in stats.items()})


async def rejection_sample(engine: Engine, tokenizer, make_env: Callable[[], Env],
                           tasks: Sequence[Task], *,
                           k: int = 4, filters: SynthFilters = SynthFilters(), seed: int = 0,
                           config: RolloutConfig | None = None, run_id: str = "",
                           concurrency: int = 32) -> SynthResult:
    """Sample `k` episodes per task from `engine`'s policy and keep the good ones (module
    docstring)."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, task: Task, g: int) -> Trajectory:
        async with sem:
            with episode_env(make_env) as env:  # closed after the episode (taurl.envs.core)
                return await run_episode(engine, env, tokenizer, task,
                                         seed=seed * 1_000_003 + i * k + g,
                                         config=config or RolloutConfig(),
                                         group_id=f"synth:{task.task_id}", run_id=run_id)

    trajs = await asyncio.gather(*(one(i, t, g) for i, t in enumerate(tasks) for g in range(k)))
    return select_demonstrations(list(trajs), tasks, filters)
