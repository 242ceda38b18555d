"""A judge as the run's training reward (``reward: {kind: judge, judge: ...}``), and how often
it agrees with the env's verifier.

    reward:
      kind: judge                      # verifier (the default, also {}): the env's own reward
      judge:
        backend: reference             # reference | url
        answer_pattern: "<answer>(.*?)</answer>"
      pass_at: 0.8                     # a judge reward >= this counts as a pass (agreement)

With ``kind: judge`` every episode of the run gets the judge's score as its outcome
component (`taurl.rollout.loop`'s ``taurl_outcome``), RL's included; the env's constraint and
shaping components stay. The env's registered verifier is then used only by the evaluator,
which re-derives success from each record and never reads its reward: the verifier is
withheld from training and stays the measure.

Backends: ``reference`` (`taurl.reward.reference_judge.ReferenceJudge`: the policy's answer
against the task's reference answers, fuzzy); ``url`` (`taurl.reward.judge.RubricJudge` with
a rubric, served at an OpenAI-compatible URL: ``url``, ``model``, ``rubric``, ``max_score``,
``show_reference`` — the task's reference answers appended to the task text the judge
reads; ``api_key_env`` names the variable that holds a key).
"""

from __future__ import annotations

import functools
import json
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from taurl.errors import ConfigError

KINDS = ("verifier", "judge")
BACKENDS = {"reference": {"answer_pattern", "max_score"},
            "url": {"url", "model", "rubric", "max_score", "show_reference", "api_key_env"}}


def reward_problems(reward: dict[str, Any]) -> list[str]:
    """What is wrong with a ``reward:`` config (module docstring); [] when it is fine."""
    if not reward:
        return []
    out = [f"reward: unknown key {k!r} (keys: kind, judge, pass_at)" for k in reward
           if k not in ("kind", "judge", "pass_at")]
    kind = reward.get("kind", "verifier")
    if kind not in KINDS:
        return out + [f"reward.kind must be one of {', '.join(KINDS)} (got {kind!r})"]
    pass_at = reward.get("pass_at", 0.8)
    if isinstance(pass_at, bool) or not isinstance(pass_at, (int, float)) or not 0 < pass_at <= 1:
        out.append(f"reward.pass_at must be a number in (0, 1] (got {pass_at!r})")
    if kind == "verifier":
        extra = ["reward.judge is set but reward.kind is verifier"] if "judge" in reward else []
        return out + extra
    judge = reward.get("judge")
    if not isinstance(judge, dict):
        return out + ["reward.kind judge needs reward.judge, e.g. {backend: reference}"]
    backend = judge.get("backend")
    if backend not in BACKENDS:
        return out + [f"reward.judge.backend must be one of {', '.join(BACKENDS)} "
                      f"(got {backend!r})"]
    out += [f"reward.judge: {k!r} is not an option of backend {backend} "
            f"({', '.join(sorted(BACKENDS[backend]))})" for k in judge
            if k != "backend" and k not in BACKENDS[backend]]
    if backend == "url":
        out += [f"reward.judge: backend url needs {k}" for k in ("url", "model", "rubric")
                if not judge.get(k)]
    if out:
        return out
    try:
        build_judge(reward)
    except ConfigError as e:
        out.append(f"reward.judge: {e}")
    return out


def is_judged(reward: dict[str, Any]) -> bool:
    return bool(reward) and reward.get("kind", "verifier") == "judge"


def build_judge(reward: dict[str, Any]) -> Any:
    """A fresh outcome ``(traj, task) -> reward in [0, 1]`` with ``version`` and ``stats``."""
    opts = {k: v for k, v in reward["judge"].items() if k != "backend"}
    if reward["judge"]["backend"] == "reference":
        from taurl.reward.reference_judge import ReferenceJudge

        return ReferenceJudge(**opts)
    from taurl.reward.judge import OpenAICompatible, Rubric, RubricJudge

    key = os.environ.get(opts["api_key_env"]) if opts.get("api_key_env") else None
    judge = RubricJudge(Rubric(opts["rubric"], int(opts.get("max_score", 10))),
                        OpenAICompatible(opts["url"], model=opts["model"], api_key=key))
    return ShownReference(judge) if opts.get("show_reference") else judge


@functools.lru_cache(maxsize=8)
def _shared(reward_json: str) -> Any:
    return build_judge(json.loads(reward_json))


def shared_judge(reward: dict[str, Any]) -> Any:
    """One judge per reward config in this process: every env of a run shares its cache."""
    return _shared(json.dumps(reward, sort_keys=True))


class ShownReference:
    """A `RubricJudge` that reads the task with its reference answers appended."""

    def __init__(self, judge: Any):
        self.judge, self.stats = judge, judge.stats
        self.version = f"{judge.version}:shown-reference"

    def __call__(self, traj: Any, task: Any) -> float:
        refs = "; ".join(task.answers) or "(none)"
        text = "".join(t.action_text for t in traj.turns)
        return self.judge.score(f"{task.prompt}\nReference answer(s): {refs}", text).reward


@dataclass(frozen=True)
class Agreement:
    """How often a judge's pass/fail matches the verifier's on the same episodes.

    rate: the share of episodes where they agree; ci95: its task-clustered 95% interval
    (`cluster_wilson_interval`: the k trials of a task are not independent draws).
    kappa: Cohen's κ = (p_o − p_e) / (1 − p_e), p_e = p_J·p_V + (1 − p_J)(1 − p_V), the
    agreement beyond what the two pass rates give by chance (Cohen 1960); nan if p_e = 1.
    """

    rate: float
    ci95: tuple[float, float]
    kappa: float
    episodes: int
    tasks: int
    both_pass: int
    judge_only: int  # the judge passed it, the verifier did not (a false positive of the judge)
    verifier_only: int  # the verifier passed it, the judge did not
    both_fail: int


def agreement(rows: Iterable[tuple[str, bool, bool]]) -> Agreement:
    """`Agreement` of ``(task_id, judge_pass, verifier_pass)`` rows."""
    per_task: dict[str, list[bool]] = defaultdict(list)
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for task_id, j, v in rows:
        per_task[task_id].append(bool(j) == bool(v))
        counts[(bool(j), bool(v))] += 1
    n = sum(counts.values())
    if n == 0:
        raise ConfigError("agreement needs at least one episode")
    p_o = (counts[(True, True)] + counts[(False, False)]) / n
    p_j = (counts[(True, True)] + counts[(True, False)]) / n
    p_v = (counts[(True, True)] + counts[(False, True)]) / n
    p_e = p_j * p_v + (1 - p_j) * (1 - p_v)
    kappa = (p_o - p_e) / (1 - p_e) if p_e < 1 else float("nan")
    from taurl.eval.stats import cluster_wilson_interval

    ci = cluster_wilson_interval([sum(v) for v in per_task.values()],
                                 [len(v) for v in per_task.values()])
    return Agreement(p_o, ci, kappa, n, len(per_task), counts[(True, True)],
                     counts[(True, False)], counts[(False, True)], counts[(False, False)])


def task_of(traj: Any) -> Any:
    """The task of a stored record, rebuilt from it: its id, split, env, gold answers
    (``metadata["answers"]``) and prompt (its first user message)."""
    from taurl.envs.core import Task

    prompt = next((str(m.get("content", "")) for m in traj.messages if m.get("role") == "user"), "")
    return Task(traj.task_id, prompt, tuple(traj.metadata.get("answers", ())), traj.split,
                traj.env_name)


def episode_agreement(trajs: Iterable[Any], judge: Any, verifier: Any,
                      pass_at: float = 0.8) -> Agreement:
    """`agreement` of a judge (pass: reward >= `pass_at`) and a verifier (pass: score 1) on the
    same records, each scored afresh from the record (neither reads its stored reward)."""
    rows = []
    for t in trajs:
        task = task_of(t)
        rows.append((t.task_id, judge(t, task) >= pass_at, verifier(t, task) >= 1.0))
    return agreement(rows)
