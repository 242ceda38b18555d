"""The simulated workload: multi-turn episodes with heavy-tailed lengths and tool latencies.

An episode is drawn once per (seed, group, member) from its own random stream, so every
schedule simulated with one seed sees exactly the same episodes in the same order
(common random numbers: schedule differences are not sampling noise).

Shape of an episode (all drawn independently):

* generated tokens L ~ LogNormal(ln median, σ), rounded, in [1, max_gen_tokens] — response
  lengths of reasoning RL are close to log-normal with a long right tail (e.g. the length
  histograms of DAPO, arXiv 2503.14476 Fig. 7, and Kimi k1.5, arXiv 2501.12599 §2.6.2 —
  the reason for partial rollouts); the cap is the generation budget, as in training;
* turns T ~ Uniform{1, …, max_turns}; L is split as evenly as possible over the T turns;
  with ``single_turn_prob`` p > 0, an episode is first made single-turn with probability p
  (a policy that answers without a tool in most episodes: P(T = 1) = p + (1 − p)/max_turns;
  p = 0 draws nothing extra, so the episodes are those of the default workload);
* between turns, T − 1 tool calls; latency ~ LogNormal(ln tool_median_s, tool_sigma);
  with probability tool_fail_prob the call fails fast (tool_fail_s, an error observation
  the agent reads and goes on from); a call longer than tool_timeout_s is cut there
  (a timeout observation) — so latency = min(draw, timeout);
* prompt_tokens and obs_tokens per observation count for the learner's cost only.

The target tail, stated in issue 11 from published systems, is "~5% of samples take ~80%
of generation". The simulator measures both readings of it — the mean over batches of the
share of a synchronous batch's generation time spent after 95% of its episodes finished
(``tail_time_share``) and the share of generated tokens in the longest 5% of samples
(``top5_token_share``), both fields of `taurl.sim.result.SimResult`. The defaults
(median 300 tokens, σ = 1.6, budget 32768, 1–4 turns) give 64% and 46% over 30 batches
of 8 × 8 (seed 0; tests/test_sim.py checks >= 60% and 30–60%): the token reading matches
(~5% of rollouts hold ~30–50% of decode tokens for a log-normal), the time reading falls
short of 80% — a finite generation budget caps the tail (σ = 2.0 with a 65536 budget
gives 71% and 58%). The learner cost makes rollout ~77% of a synchronous step, inside
the 50–80% reported for these systems.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from taurl.errors import ConfigError


@dataclass(frozen=True)
class Workload:
    """What is generated and what each part costs (times in virtual seconds)."""

    tasks_per_batch: int = 8  # groups (tasks) per learner batch
    group_size: int = 8  # rollouts per task (GRPO group); batches are group-complete
    gen_median_tokens: float = 300.0  # median generated tokens of an episode (all turns)
    gen_sigma: float = 1.6  # σ of ln(generated tokens); 0 gives constant lengths
    max_gen_tokens: int = 32768  # generation budget of an episode (the lognormal is cut here)
    max_turns: int = 4  # turns T ~ Uniform{1..max_turns}
    # extra probability that an episode is one turn, no tool call (module docstring)
    single_turn_prob: float = 0.0
    prompt_tokens: int = 256  # prompt tokens (learner cost only)
    obs_tokens: int = 128  # tokens of each tool observation (learner cost and re-prefill)
    tool_median_s: float = 0.2  # median tool latency
    tool_sigma: float = 1.0  # σ of ln(tool latency): a heavy tail
    tool_fail_prob: float = 0.05  # probability a tool call fails fast
    tool_fail_s: float = 0.01  # latency of a failed call
    tool_timeout_s: float = 5.0  # a tool call is cut at this latency (timeout observation)
    # decode step time a + b·batch: fixed part (weights read once per step)
    decode_a_s: float = 0.02
    decode_b_s: float = 1e-4  # decode step time per sequence in the batch (continuous batching)
    max_concurrent: int = 512  # episodes the generator holds at once (KV-cache slots)
    sync_s: float = 2.0  # weight-sync pause of the generator at each version change
    # interrupted sequences recompute their KV cache on new weights
    reprefill_s_per_token: float = 2e-6
    learn_fixed_s: float = 1.0  # learner step: fixed cost (optimizer step, checkpoint)
    # learner step: cost per trained token (prompt + actions + observations)
    learn_s_per_token: float = 1e-3

    @property
    def batch_episodes(self) -> int:
        return self.tasks_per_batch * self.group_size

    def problems(self) -> list[str]:
        out = []
        for f in fields(self):
            v = getattr(self, f.name)
            if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                or v < 0):
                out.append(f"workload.{f.name} must be a finite number >= 0, got {v!r}")
        if out:
            return out
        for name in ("tasks_per_batch", "group_size", "max_gen_tokens", "max_turns",
                     "max_concurrent"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                out.append(f"workload.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.gen_median_tokens < 1:
            out.append(f"workload.gen_median_tokens must be >= 1, got {self.gen_median_tokens!r}")
        if self.decode_a_s + self.decode_b_s <= 0:
            out.append("workload.decode_a_s + decode_b_s must be > 0 (a decode step takes time)")
        if self.group_size > self.max_concurrent:
            out.append(f"workload.max_concurrent ({self.max_concurrent}) must hold one group "
                       f"({self.group_size})")
        if not 0 <= self.single_turn_prob <= 1:
            out.append(
                f"workload.single_turn_prob must be in [0, 1], got {self.single_turn_prob!r}"
            )
        if not 0 <= self.tool_fail_prob <= 1:
            out.append(f"workload.tool_fail_prob must be in [0, 1], got {self.tool_fail_prob!r}")
        return out

    def check(self) -> Workload:
        if problems := self.problems():
            raise ConfigError(problems)
        return self


@dataclass(frozen=True)
class EpisodePlan:
    """What one episode will do if it runs to the end."""

    turn_tokens: tuple[int, ...]  # generated tokens of each turn (sum = the episode's length)
    tool_s: tuple[float, ...]  # latency of the tool call after each turn but the last
    tool_outcome: tuple[str, ...]  # "ok" | "failed" | "timeout" per tool call
    prompt_tokens: int
    obs_tokens: int

    @property
    def gen_tokens(self) -> int:
        return sum(self.turn_tokens)

    @property
    def total_tokens(self) -> int:
        """Tokens of the finished sequence: what the learner processes."""
        return self.prompt_tokens + self.gen_tokens + self.obs_tokens * len(self.tool_s)

    def context_before(self, turn: int) -> int:
        """Tokens in the context when turn `turn` starts (what an interruption re-prefills)."""
        return self.prompt_tokens + sum(self.turn_tokens[:turn]) + self.obs_tokens * turn


def draw_episode(w: Workload, seed: int, group: int, member: int) -> EpisodePlan:
    """The plan of member `member` of group `group` (module docstring); a pure function of its
    arguments."""
    rng = np.random.default_rng([seed, group, member])
    n = float(np.exp(math.log(w.gen_median_tokens) + w.gen_sigma * rng.standard_normal()))
    length = int(min(max(round(n), 1), w.max_gen_tokens))
    turns = int(rng.integers(1, w.max_turns + 1))
    if w.single_turn_prob > 0 and rng.random() < w.single_turn_prob:
        turns = 1
    turns = min(turns, length)  # every turn generates at least one token
    base, extra = divmod(length, turns)
    turn_tokens = tuple(base + (1 if i < extra else 0) for i in range(turns))
    tool_s, outcome = [], []
    for _ in range(turns - 1):
        if rng.random() < w.tool_fail_prob:
            tool_s.append(w.tool_fail_s)
            outcome.append("failed")
            continue
        lat = float(
            np.exp(math.log(max(w.tool_median_s, 1e-12)) + w.tool_sigma * rng.standard_normal())
        )
        if w.tool_median_s == 0:
            lat = 0.0
        tool_s.append(min(lat, w.tool_timeout_s))
        outcome.append("timeout" if lat >= w.tool_timeout_s else "ok")
    return EpisodePlan(turn_tokens, tuple(tool_s), tuple(outcome), w.prompt_tokens, w.obs_tokens)


def top_share(lengths: list[int] | np.ndarray, top: float = 0.05) -> float:
    """Share of the total in the largest `top` fraction of `lengths` (at least one sample).

    >>> top_share([1] * 19 + [81])
    0.81
    """
    s = np.sort(np.asarray(lengths, dtype=float))[::-1]
    k = max(1, math.ceil(top * len(s)))
    return float(s[:k].sum() / s.sum()) if s.sum() > 0 else 0.0
