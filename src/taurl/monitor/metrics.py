"""Rollout metrics with namespaced keys, and the `metrics.jsonl` writer.

Every key is documented in `GLOSSARY` with its formula; docs/metrics.md's glossary is generated from
this dictionary.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from taurl.data.trajectory import StopReason, Trajectory

GLOSSARY: dict[str, str] = {
    "rollout/episodes": "number of finished episodes",
    "rollout/failed_episodes": "episodes that produced no record (each failure is logged with its "
                               "reason)",
    "rollout/reward_mean": "mean of trajectory.reward",
    "rollout/reward_std": "population std of trajectory.reward",
    "rollout/success": "share of episodes with reward >= 1 (outcome verified)",
    "rollout/turns_mean": "mean number of actions per episode",
    "rollout/tool_calls_mean": "mean number of tool calls (e.g. searches) per episode",
    "rollout/search_rate": "share of episodes with at least one tool call",
    "rollout/invalid_rate": "invalid actions / actions",
    "rollout/error_rate": "share of episodes ended by an error (invalid samples)",
    "rollout/truncation_rate": "share of episodes with truncated = true",
    "rollout/streams_per_episode": "token streams per episode (> 1: the context was compacted or a "
                                   "template rewrote history; docs/long_horizons.md)",
    "rollout/stop/<reason>": "share of episodes that stopped for <reason> (answered, no_answer, "
                             "max_turns, ...)",
    "rollout/tokens_mean": "mean tokens per episode (prompt + actions + observations)",
    "rollout/action_tokens_mean": "mean sampled (mask 1) tokens per episode",
    "rollout/episodes_per_s": "episodes / wall seconds of the rollout phase",
    "rollout/gen_tokens_per_s": "sampled tokens / wall seconds of the rollout phase",
    "rollout/wall_s": "wall seconds of the rollout phase",
}


def rollout_metrics(trajs: list[Trajectory], wall_s: float, failed: int = 0) -> dict[str, float]:
    """Aggregate a batch of trajectories into `rollout/*` metrics (see GLOSSARY)."""
    n = len(trajs)
    out: dict[str, float] = {"rollout/episodes": n, "rollout/failed_episodes": failed,
                             "rollout/wall_s": wall_s}
    if n == 0:
        return out
    rewards = [t.reward for t in trajs]
    mean = sum(rewards) / n
    actions = sum(len(t.turns) for t in trajs)
    gen_tokens = sum(t.num_action_tokens for t in trajs)
    stops = Counter(t.stop_reason.value for t in trajs if t.stop_reason)
    out.update({
        "rollout/reward_mean": mean,
        "rollout/reward_std": (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5,
        "rollout/success": sum(r >= 1.0 for r in rewards) / n,
        "rollout/turns_mean": actions / n,
        "rollout/tool_calls_mean": sum(t.num_tool_calls for t in trajs) / n,
        "rollout/search_rate": sum(t.num_tool_calls > 0 for t in trajs) / n,
        "rollout/invalid_rate": sum(t.num_invalid_actions for t in trajs) / max(actions, 1),
        "rollout/error_rate": stops.get(StopReason.ERROR.value, 0) / n,
        "rollout/truncation_rate": sum(t.truncated for t in trajs) / n,
        "rollout/streams_per_episode": sum(t.num_streams for t in trajs) / n,
        "rollout/tokens_mean": sum(t.num_tokens for t in trajs) / n,
        "rollout/action_tokens_mean": gen_tokens / n,
        "rollout/episodes_per_s": n / wall_s if wall_s > 0 else 0.0,
        "rollout/gen_tokens_per_s": gen_tokens / wall_s if wall_s > 0 else 0.0,
    })
    for reason in sorted(set(stops) | {r.value for r in StopReason}):  # an env's own reasons too
        out[f"rollout/stop/{reason}"] = stops.get(reason, 0) / n
    return out


class MetricsWriter:
    """Appends one JSON object per line to `metrics.jsonl` (step, time, metrics)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        row = {"step": step, "time": time.time(), **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        return row  # what a tracking sink (taurl.monitor.sinks) receives

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def same_reward_share(trajs: list) -> float:
    """Share of groups whose rollouts all got the same reward (they carry no GRPO signal)."""
    groups: dict[str, set[float]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, set()).add(t.reward)
    return sum(len(v) == 1 for v in groups.values()) / max(len(groups), 1)


def console_line(row: dict[str, Any], total: int) -> str:
    """The live line printed after each update."""
    g = row.get
    return (f"update {g('update')}/{total} v{g('policy/version')}  reward "
            f"{g('rollout/reward_mean', 0):.2f}±{g('rollout/reward_std', 0):.2f}  success "
            f"{g('rollout/success', 0):.2f}  tools {g('rollout/search_rate', 0):.2f}  same-groups "
            f"{g('rollout/groups_same_reward', 0):.2f}  invalid "
            f"{g('rollout/invalid_rate', 0):.2f}  trunc {g('rollout/truncation_rate', 0):.2f}  "
            f"{_learn_part(row)}  |g| {g('learn/grad_norm', 0):.2f}  roll "
            f"{g('time/rollout_s', 0):.1f}s learn {g('time/learn_s', 0):.1f}s")


def _learn_part(row: dict[str, Any]) -> str:
    """The learner's figures of the stage that made `row` (RL, DPO or distillation)."""
    g = row.get
    if "distill/reverse_kl_k1" in row:
        return f"kl(student|teacher) {g('distill/reverse_kl_k1'):.4f}"
    if "learn/dpo_pairs" in row:
        return (f"pairs {g('learn/dpo_pairs'):.0f}  dpo {g('learn/dpo_loss', 0):.3f}  acc "
                f"{g('learn/dpo_reward_acc', 0):.2f}")
    return (f"clip {g('learn/clip_frac', 0):.3f}  kl {g('learn/approx_kl', 0):.4f}  ent "
            f"{g('learn/entropy', 0):.2f}")
