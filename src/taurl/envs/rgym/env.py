"""The reasoning-gym env: one question of a reasoning-gym family, answered inline.

Protocol (inline, like search-v0, so that a policy built from scratch can learn it): the
episode is one assistant message; the model ends with ``<answer>…</answer>`` (the engine
stops at ``</answer>``) and the family's own `score_answer` is the reward (partial credit
as the family gives it; ``reward_components={"outcome": r}``).

With ``tools: python`` the model may also run Python: ``<python>CODE</python>`` (the engine
stops at ``</python>``) runs CODE with ``python3 -`` in a taurl sandbox (`taurl.tools.sandbox`:
bubblewrap namespaces, no network, rlimits, a wall-clock timeout), one fresh workspace per
episode, and the output comes back inline as ``<information>…</information>``. Each run is
a tool call with a receipt in the trajectory, and counts against the loop's tool budget.

The LAST complete ``<answer>``/``<python>`` in an action counts; an action with neither is
invalid (the model is told, the turn counts). `max_turns` actions end the episode
(truncated, ``stop_reason="max_turns"``). Reset reports the task's provenance (package,
version, dataset, options, seed, index), which the loop keeps in the record.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from taurl.data.trajectory import ToolReceipt
from taurl.envs.core import Task
from taurl.envs.rgym.tasks import NAME, PACKAGE, dataset_options, rg_version, score
from taurl.errors import ConfigError, ResetNeeded

VERSION = "1"  # bump when an observation, the parser or the reward changes meaning
SYSTEM_PROMPT = "Answer the question. Give only the final answer between <answer> and </answer>."
TOOL_PROMPT = (" You may run Python first: write <python>code</python>; what it prints comes back "
               "between <information> and </information>.")
INVALID = "\n<information>Invalid: end with <answer>your answer</answer>.</information>\n"
MAX_OUTPUT_CHARS = 2000
PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "python", "description": "Run Python 3 code in a sandbox; returns what it "
                                                  "prints.",
                 "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                "required": ["code"], "additionalProperties": False}},
}
_ACTION = re.compile(r"<(answer|python)>(.*?)</\1>", re.DOTALL)


def parse_action(text: str) -> dict[str, str]:
    """The last complete action: {"kind": "answer", "answer"} | {"kind": "python", "code"}
    | {"kind": "invalid"} (an empty program is invalid; an empty answer is a wrong one)."""
    matches = list(_ACTION.finditer(text))
    if not matches:
        return {"kind": "invalid"}
    tag, body = matches[-1].group(1), matches[-1].group(2).strip()
    if tag == "python":
        return {"kind": "python", "code": body} if body else {"kind": "invalid"}
    return {"kind": "answer", "answer": body}


class ReasoningGymEnv:
    """A reasoning-gym family as a taurl env (module docstring). One episode at a time."""

    name = NAME
    version = VERSION
    observation_style = "inline"

    def __init__(self, dataset: str = "", max_turns: int = 1, tools: str | None = None,
                 python_timeout_s: float = 5.0, **options: Any) -> None:
        problems = []
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            problems.append(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if tools not in (None, "none", "python"):
            problems.append("tools must be 'python' (the sandboxed Python tool) or none, got "
                            f"{tools!r}")
        if not python_timeout_s > 0:
            problems.append(f"python_timeout_s must be > 0, got {python_timeout_s!r}")
        if problems:
            raise ConfigError(problems)
        # the dataset name and its options are checked here too (the recipe builds one env
        # before any file is written)
        self.dataset, self.options = dataset_options({"dataset": dataset, **options})
        self.max_turns, self.python_timeout_s = max_turns, python_timeout_s
        self.use_python = tools == "python"
        self.tools = [dict(PYTHON_TOOL)] if self.use_python else []
        self.stop = ("</python>", "</answer>") if self.use_python else ("</answer>",)
        self.system_prompt = SYSTEM_PROMPT + (TOOL_PROMPT if self.use_python else "")
        self.verifier_version = f"reasoning-gym {rg_version()} score_answer"
        # what every record and the run summary say about the world (taurl.recipe: summary)
        self.provenance = {"package": PACKAGE, "version": rg_version(), "env_id": self.dataset,
                           "options": self.options,
                           "tools": "python" if self.use_python else "none"}
        self._task: Task | None = None
        self._done, self._turn = True, 0
        self._sandbox: Any = None

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if task.env != self.name or "entry" not in task.metadata:
            raise ConfigError(f"task {task.task_id!r} is not a reasoning-gym task (env "
                              f"{task.env!r}); make tasks with the reasoning-gym task source")
        self._close_sandbox()
        self._task, self._done, self._turn = task, False, 0
        prov = {**self.provenance, **task.metadata["provenance"], "episode_seed": seed}
        return "", {"task_id": task.task_id, "seed": seed, "env": self.name,
                    "env_version": self.version,
                    "verifier_version": self.verifier_version, "max_turns": self.max_turns,
                    "provenance": prov}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        parsed = self._begin(action)
        if parsed["kind"] == "python":
            from taurl.tools.executor import run_blocking

            return run_blocking(self._python_step(parsed))
        return self._finish(parsed, "")

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        parsed = self._begin(action)
        return (await self._python_step(parsed) if parsed["kind"] == "python"
                else self._finish(parsed, ""))

    def _begin(self, action: str) -> dict[str, Any]:
        if self._task is None or self._done:
            raise ResetNeeded("ReasoningGymEnv.step called before reset() or after the episode "
                              "ended; call reset(task) first")
        self._turn += 1
        parsed = parse_action(action)
        if parsed["kind"] == "python" and not self.use_python:
            return {"kind": "invalid", "why": "no python tool (env_config tools: python offers it)"}
        return parsed

    async def _python_step(self, parsed: dict[str, Any]) -> tuple[str, float, bool, bool,
                                                                  dict[str, Any]]:
        t0 = time.perf_counter()
        args = {"code": parsed["code"]}
        try:
            result = await self._run_python(parsed["code"])
        except Exception as e:  # noqa: BLE001 — a sandbox failure: the model is told, the episode goes on
            error = f"{type(e).__name__}: {e}"
            receipt = ToolReceipt(tool="python", arguments=args, decision="allowed", status="error",
                                  reason=error, latency_s=time.perf_counter() - t0)
            return self._finish(parsed, "\n<information>the sandbox failed: "
                                        f"{error}</information>\n",
                                receipt=receipt, error=error)
        body = _format(result)
        status = "timeout" if result.timed_out else ("ok" if result.exit_code == 0 else "error")
        receipt = ToolReceipt(tool="python", arguments=args, decision="allowed", status=status,
                              latency_s=time.perf_counter() - t0, output_chars=len(body),
                              truncated_output=(len(body) >= MAX_OUTPUT_CHARS
                                                or result.truncated_stdout))
        return self._finish(parsed, f"\n<information>{body}</information>\n", receipt=receipt)

    async def _run_python(self, code: str) -> Any:
        from taurl.tools.sandbox import Sandbox, SandboxConfig, SandboxLimits

        if self._sandbox is None:  # one workspace per episode, made on the first run only
            limits = SandboxLimits(timeout_s=self.python_timeout_s,
                                   cpu_s=max(1, int(self.python_timeout_s)),
                                   memory_bytes=512 << 20, nproc=16, max_output_bytes=8 << 10,
                                   max_drain_bytes=1 << 20)
            self._sandbox = await asyncio.to_thread(Sandbox.create, SandboxConfig(limits=limits))
        return await self._sandbox.run(["python3", "-"], stdin=code)

    def _finish(self, parsed: dict[str, Any], obs: str, *, receipt: ToolReceipt | None = None,
                error: str | None = None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        info: dict[str, Any] = {"action": parsed, "invalid": parsed["kind"] == "invalid",
                                "turn": self._turn}
        if receipt is not None:
            info["receipt"] = receipt
        if error:
            info["error"] = error
        reward, terminated, truncated = 0.0, False, False
        if parsed["kind"] == "answer":
            assert self._task is not None
            reward, terminated, obs = score(self._task, parsed["answer"]), True, ""
            info.update(stop_reason="answered")
        elif parsed["kind"] == "invalid":
            obs = INVALID
        if not terminated and self._turn >= self.max_turns:
            truncated, obs = True, ""
            info["stop_reason"] = "max_turns"
        if terminated or truncated:
            info.update(reward_components={"outcome": reward},
                        verifier_version=self.verifier_version)
            self._done = True
            self._close_sandbox()
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """End the episode's sandbox now. The env ends it when the episode ends by the env
        (an answer, max_turns); an episode the loop ends on its own budget (tokens, context)
        never tells the env, so the loop's callers call this (`taurl.envs.core.close_env`)."""
        self._close_sandbox()

    def _close_sandbox(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None


def _format(result: Any) -> str:
    """What the model reads of a run: stdout, then stderr's tail on a failure (cut)."""
    out = result.stdout.rstrip()
    if result.timed_out:
        out += f"\n(timed out after {result.wall_s:.1f} s)"
    elif result.exit_code != 0:
        out += f"\n(exit status {result.exit_code})\n{result.stderr.rstrip()[-400:]}"
    return out.strip()[:MAX_OUTPUT_CHARS]
