"""verifiers (the `verifiers` package, the Environments Hub's format) environments as taurl envs.

    env: verifiers
    env_config: {env_id: my-env, env_args: {difficulty: 2}}

``env_id`` names an installed environment package (its module exports
``load_environment(**env_args)``, as `verifiers.load_environment` finds it: "my-env" is
module ``my_env``). The env's dataset rows are taurl tasks and its rubric is the reward;
taurl's loop samples the model and the verifiers env supplies everything else, through
its own code:

* rows: ``get_dataset()`` is the training pool; ``get_eval_dataset()`` (when the env has
  one) is split by content hash into validation and holdout, and a training row with the
  same content as an evaluation row is dropped; without one, the dataset is split 80/10/10
  by content hash. The prompt is the row's last user message; its system message, when
  present, is the env's system prompt;
* an episode: the state comes from the env's ``init_state(row)``; each action is an
  assistant message (Hermes ``<tool_call>`` blocks become its ``tool_calls``); a
  ``SingleTurnEnv`` ends after one; a ``ToolEnv`` runs the calls with its own
  ``env_response`` (each call a receipt) and ends at a message without calls; any other
  ``MultiTurnEnv`` answers with its ``env_response`` and ends when its stop conditions
  (``is_completed``) say so, or at `max_turns`;
* the reward: ``rubric.score_rollout(state)`` on the finished conversation (its weighted
  reward functions; ``reward_components`` keeps each function's score). The evaluator's
  verifier replays the record's actions in a fresh state and scores it again.

Not supported: group-level reward functions (a rubric that scores a whole group) and envs
that need a model client of their own (a judge model): the rubric runs with no client.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from importlib.metadata import version as package_version
from typing import Any

from taurl.data.trajectory import ToolReceipt
from taurl.envs.core import Task, seen_by_env
from taurl.envs.gym.splits import split_of
from taurl.errors import ConfigError, ResetNeeded
from taurl.tools.executor import run_blocking
from taurl.tools.parsers import parse_hermes

NAME = "verifiers-v0"  # registered as ``verifiers``
VERSION = "1"
PACKAGE = "verifiers"
OPTIONS = ("env_id", "env_args", "max_turns")
_LOADED: dict[str, Any] = {}
# verifiers' stop conditions that are budgets, not the task's end (taurl: truncated)
TRUNCATING = ("max_turns_reached", "prompt_too_long", "max_total_completion_tokens_reached",
              "has_error")


# The (env_id, env_args) that a config of this process named. A replay verifier reads them
# from the record it scores, and a ledger someone else wrote must never make this process
# import a module it was not configured with (`load(replay=True)` refuses).
_CONFIGURED: set[str] = set()


def load(env_config: dict[str, Any], *, replay: bool = False) -> Any:
    """The verifiers env of `env_config` (loaded once per process and config). `replay`: the
    config comes from a record, so it must be one a config of this process named."""
    unknown = sorted(set(env_config) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"env verifiers has no option(s) {unknown}; its options: "
                          f"{', '.join(OPTIONS)}")
    env_id = env_config.get("env_id")
    if not isinstance(env_id, str) or not env_id:
        raise ConfigError("env verifiers needs env_config 'env_id', an installed verifiers "
                          "environment (a module exporting load_environment), e.g. {\"env_id\": "
                          "\"my-env\"}")
    key = json.dumps([env_id, env_config.get("env_args", {})], sort_keys=True, default=str)
    if not replay:
        _CONFIGURED.add(key)
    elif key not in _CONFIGURED:
        raise ConfigError(f"the record to verify names the verifiers environment {env_id!r} "
                          f"with env_args {env_config.get('env_args', {})!r}, which no env "
                          "config of this process names: the replay verifier loads only what "
                          "your config names. Evaluate with the config the run was trained "
                          "with, or check where the ledger came from")
    if key not in _LOADED:
        try:
            import verifiers as vf
        except ImportError as e:
            raise ConfigError(f"env verifiers needs the verifiers package ({e}); pip install "
                              "'taurl[ecosystem]'") from e
        try:
            _LOADED[key] = vf.load_environment(env_id, **env_config.get("env_args", {}))
        except (ImportError, AttributeError, TypeError, ValueError) as e:
            raise ConfigError(f"verifiers could not load environment {env_id!r}: "
                              f"{type(e).__name__}: {e}") from e
    return _LOADED[key]


def _row_key(row: dict[str, Any]) -> str:
    return json.dumps([row.get("prompt"), row.get("answer")], sort_keys=True, default=str)


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def verifiers_tasks(split: str, n: int, seed: int = 0, *,
                    env_config: dict[str, Any] | None = None) -> list[Task]:
    """Up to `n` rows of `split` (module docstring); training rows repeat when `n` asks for more."""
    env = load(env_config or {})
    rows = [dict(r) for r in env.get_dataset()]
    if getattr(env, "eval_dataset", None) is not None:
        evals = [dict(r) for r in env.get_eval_dataset()]
        held = {_row_key(r) for r in evals}
        pools = {"train": [r for r in rows if _row_key(r) not in held],
                 "validation": [r for r in evals
                                if split_of(_row_key(r), (0.0, 0.5, 0.5)) == "validation"],
                 "holdout": [r for r in evals
                             if split_of(_row_key(r), (0.0, 0.5, 0.5)) == "holdout"]}
    else:
        pools = {s: [r for r in rows if split_of(_row_key(r), (0.8, 0.1, 0.1)) == s]
                 for s in ("train", "validation", "holdout")}
    pool = list({_row_key(r): r for r in pools[split]}.values())
    random.Random(seed).shuffle(pool)
    if split == "train" and pool:
        pool = (pool * (n // len(pool) + 1))[:n]
    out = []
    for row in pool[:n]:
        prompt = row.get("prompt") or []
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        key = hashlib.blake2b(_row_key(row).encode(), digest_size=8).hexdigest()
        out.append(Task(task_id=f"{env_config['env_id']}-{key}",
                        prompt=_text(users[-1]["content"]) if users else "",
                        answers=(str(row["answer"]),
                                 ) if row.get("answer") not in (None, "") else (), split=split,
                        env=NAME, metadata={"row": json.loads(json.dumps(row, default=str))}))
    return out


class VerifiersEnv:
    """A verifiers environment as a taurl env (module docstring). One episode at a time."""

    name = NAME
    version = VERSION
    observation_style = "messages"
    stop = ("</tool_call>",)

    def __init__(self, max_turns: int = 8, _replay: bool = False, **env_config: Any) -> None:
        import verifiers as vf

        self.vf, self.venv = vf, load(env_config, replay=_replay)
        self.env_config, self.max_turns = env_config, max_turns
        self.kind = ("single_turn" if isinstance(self.venv, vf.SingleTurnEnv) else
                     "tool" if isinstance(self.venv, vf.ToolEnv) else "multi_turn")
        self.tools = [{"type": "function",
                       "function": {"name": t.name, "description": t.description or "",
                                                        "parameters": t.parameters}}
                      for t in (getattr(self.venv, "tool_defs", None) or [])]
        self.system_prompt = getattr(self.venv, "system_prompt", None) or ""
        self.verifier_version = f"verifiers {package_version(PACKAGE)} rubric"
        self.provenance = {"package": PACKAGE, "version": package_version(PACKAGE),
                           "env_id": env_config.get("env_id"),
                           "env_args": env_config.get("env_args", {}),
                           "kind": self.kind, "env_class": type(self.venv).__name__}
        self._state: Any = None
        self._done, self._turn = True, 0

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if task.env != self.name or "row" not in task.metadata:
            raise ConfigError(f"task {task.task_id!r} is not a verifiers task; make tasks with env "
                              "verifiers' task source")
        # never called: taurl samples
        client = self.vf.ClientConfig(api_base_url="http://127.0.0.1:9/v1")
        self._state = run_blocking(self.venv.init_state(dict(task.metadata["row"]), client,
                                                        "taurl"))
        self._messages = list(self._state["prompt"])
        self._done, self._turn = False, 0
        return "", {"task_id": task.task_id, "seed": seed, "env": self.name,
                    "env_version": self.version, "verifier_version": self.verifier_version,
                    "provenance": {**self.provenance, "seed": seed}}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return run_blocking(self.astep_on_tools_loop(action))

    async def astep_on_tools_loop(self, action: str) -> tuple[str, float, bool, bool,
                                                              dict[str, Any]]:
        if self._state is None or self._done:
            raise ResetNeeded("VerifiersEnv.step called before reset() or after the episode ended; "
                              "call reset(task) first")
        self._turn += 1
        vf = self.vf
        parsed = parse_hermes(action) if self.tools else None
        calls = list(parsed.calls) if parsed is not None and parsed.ok else []
        content = action.split("<tool_call>")[0] if calls else action
        msg = vf.AssistantMessage(content=content, tool_calls=[
            vf.ToolCall(id=f"call_{self._turn}_{i}", name=c.name, arguments=json.dumps(c.arguments))
            for i, c in enumerate(calls)] or None)
        before = list(self._messages)
        self._messages.append(msg)
        self._state["trajectory"].append({"prompt": before, "completion": [msg],
                                          "is_truncated": False})
        info: dict[str, Any] = {"action": {"kind": "tool_call" if calls else "answer",
                                           **({"calls": [{"name": c.name,
                                                          "arguments": c.arguments} for c in calls]}
                                              if calls else {"answer": action})},
                                "invalid": (parsed is not None
                                            and parsed.kind in ("malformed", "too_long")),
                                "turn": self._turn}
        obs, role = "", "tool"
        # verifiers' own order: the stop conditions look at the new message first, then the
        # env answers (MultiTurnEnv.rollout)
        done = (self.kind == "single_turn" or (self.kind == "tool" and not calls)
                or (self.kind == "multi_turn" and await self.venv.is_completed(self._state)))
        if not done and self._turn < self.max_turns:
            t0 = time.perf_counter()
            replies = await self.venv.env_response(self._messages, self._state)
            self._messages.extend(replies)
            obs = "\n".join(_text(getattr(m, "content", "")) for m in replies)
            role = getattr(replies[0], "role", "tool") if replies else "tool"
            if calls:  # one receipt for the message's calls (the loop keeps one per turn)
                info["receipt"] = ToolReceipt(tool=calls[0].name, arguments=calls[0].arguments,
                                              decision="allowed",
                                              status="ok", latency_s=time.perf_counter() - t0,
                                              output_chars=len(obs))
        truncated = not done and self._turn >= self.max_turns
        condition = self._state.get("stop_condition") if done else None
        if condition in TRUNCATING:  # the env's own budget ran out: a truncation, as taurl's would
            done, truncated = False, True
        reward = 0.0
        if done or truncated:
            reward, components = await self._score()
            reason = "max_turns" if truncated else (condition or "answered")
            info.update(stop_reason=reason, reward_components=components,
                        verifier_version=self.verifier_version)
            self._done = True
        info["role"] = role
        return ("" if self._done else obs), reward, done, truncated, info

    async def _score(self) -> tuple[float, dict[str, float]]:
        """The rubric's reward of the conversation so far (each function's score beside it)."""
        self._state["completion"] = self._messages[len(self._state["prompt"]):]
        await self.venv.rubric.score_rollout(self._state)
        metrics = {k: float(v) for k, v in (self._state.get("metrics") or {}).items()}
        return float(self._state["reward"] or 0.0), {
            "outcome": float(self._state["reward"] or 0.0),
            **{f"rubric/{k}": v for k, v in metrics.items()}}


class VerifiersVerifier:
    """The evaluator's scorer: the record's actions replayed on a fresh state of the same
    row, scored by the env's rubric (never the record's stored reward)."""

    name = "verifiers/rubric"

    def __init__(self) -> None:
        self.version = f"verifiers {package_version(PACKAGE)} rubric"
        self.calls = 0
        self._envs: dict[str, VerifiersEnv] = {}

    def __call__(self, traj: Any, task: Task) -> float:
        self.calls += 1
        if traj.task_id != task.task_id or not traj.turns:
            return 0.0
        prov = traj.provenance
        cfg = {"env_id": prov["env_id"], "env_args": prov.get("env_args", {})}
        key = json.dumps(cfg, sort_keys=True, default=str)
        env = self._envs.get(key) or self._envs.setdefault(
            key, VerifiersEnv(max_turns=len(traj.turns), _replay=True, **cfg)
        )
        env.max_turns = len(traj.turns)
        env.reset(task)
        reward = 0.0
        for turn in traj.turns:
            _, reward, term, trunc, _ = env.step(seen_by_env(turn))
            if term or trunc:
                break
        return float(reward)
