"""The agent runner: N copies of a user's agent, each with its own proxy base URL.

    agent:                                   # the config key (TrainConfig.agent)
      callable: examples/openai_agent.py:run_agent   # a file or module, and a function, or
      command: [python, examples/openai_agent.py]     # a command line
      timeout_s: 60                          # an agent that hangs is stopped here
      max_calls: 8                           # model calls per episode
      tools: {mcp_servers: [...], allow: [...]}   # tools taurl runs behind its gate
                                                  # (`taurl.proxy.tools`)

A callable is called as ``fn(task_prompt, base_url, retriever_url) -> answer`` in its own
thread; an ``async def`` one is awaited on one event loop shared by every episode for the
process's life (async frameworks keep clients bound to the loop they first ran on: the
Agents SDK's shared HTTP client), so it must not block that loop. Either gets, for each it takes as
an argument: ``anthropic_base_url=`` (the `anthropic` SDK's base URL, `taurl.proxy.messages`), and
with `tools` set ``tools_url=`` and ``mcp_url=`` (the episode's MCP endpoint,
`taurl.proxy.mcp_endpoint`). A command runs with ``OPENAI_BASE_URL`` (the episode's),
``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``, ``TAURL_TASK``,
``TAURL_RETRIEVER_URL``, ``TAURL_TOOLS_URL`` and ``TAURL_MCP_URL`` (with `tools`) and
``TAURL_EPISODE_ID`` in its environment and prints its answer on the last line of stdout. Either way
the agent imports nothing from taurl. What the proxy captured becomes the episode's trajectory: one
record whose token streams are its chains (`taurl.proxy.capture`; `taurl.data.streams`, each
stream's reason the chain's), scored by ``POST /reward`` or else by the env's verifier reading the
final answer; then the recipe's own credit, learner, ledger and evaluation take over.

With an admission policy (`taurl.proxy.admission`), the runner asks it before starting
the agent and waits what it says (at most `ADMISSION_PATIENCE_S` in all; an episode not
admitted by then is not run and is counted in ``rollout/failed_episodes``).

An agent that raises, exits non-zero or outlives `timeout_s` ends its episode truncated
with stop reason ``error`` (an invalid sample; counted as ``rollout/agent_errors``) — unless
the proxy refused a call first for a budget: ``agent.max_calls`` spent (``max_turns``) or a
conversation longer than the context (``context_full``). That refusal ends the episode as
the built-in loop's budgets do, a valid truncation trained on as such, whatever the agent
does after it (its SDK raises on the 400). An episode without any sampled call leaves no
record (``rollout/failed_episodes``) with its cause, the refusal first; a round in which no
episode left one stops the run with that cause (`taurl.rollout.runner.close_round`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from taurl.data.chains import join_streams
from taurl.data.trajectory import (
    POLICY_SOURCE,
    Segment,
    StopReason,
    Trajectory,
    Turn,
    sampling_record,
)
from taurl.errors import ConfigError, Error
from taurl.proxy.capture import Call, Chain
from taurl.proxy.server import ProxyEpisode, ProxyLimits, ProxyServer
from taurl.rollout.runner import EpisodeError

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
ADMISSION_PATIENCE_S = 600.0  # the most the runner waits for an episode's admission


@dataclass(frozen=True)
class AgentConfig:
    """The `agent:` config key (module docstring)."""

    callable: str = ""  # "path/to/file.py:function" or "package.module:function"
    command: tuple[str, ...] = ()  # argv of a command-line agent
    timeout_s: float = 120.0  # wall-clock limit of one episode
    max_calls: int = 8  # model calls per episode
    # "module:function": expert replies for SFT demos (default: the env's, see experts.py)
    expert: str = ""
    name: str = field(default="", compare=False)
    # `taurl.proxy.tools` (mcp_servers, allow, ...)
    tools: dict[str, Any] = field(default_factory=dict, compare=False)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> AgentConfig:
        if problems := agent_problems(d):
            raise ConfigError(problems)
        cmd = d.get("command") or ()
        cmd = tuple(cmd.split()) if isinstance(cmd, str) else tuple(cmd)
        return AgentConfig(d.get("callable", ""), cmd, float(d.get("timeout_s", 120.0)),
                           int(d.get("max_calls", 8)), d.get("expert", ""),
                           d.get("callable") or " ".join(cmd), dict(d.get("tools") or {}))


def agent_problems(d: Any) -> list[str]:
    """Everything wrong with an `agent:` mapping, in words (empty when it is fine)."""
    if not isinstance(d, dict):
        return ["agent must be a mapping with 'callable' or 'command' (docs/agents.md)"]
    out = []
    known = {"callable", "command", "timeout_s", "max_calls", "expert", "tools"}
    if unknown := sorted(set(d) - known):
        out.append(f"agent: unknown key(s) {unknown}; known: {sorted(known)}")
    if bool(d.get("callable")) == bool(d.get("command")):
        out.append("agent needs exactly one of 'callable' (\"file.py:function\") or 'command' (an "
                   "argv list)")
    c = d.get("callable")
    if c and (not isinstance(c, str) or ":" not in c):
        out.append(f"agent.callable {c!r} must be \"path/to/file.py:function\" or "
                   "\"module:function\"")
    t = d.get("timeout_s", 1)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
        out.append(f"agent.timeout_s must be a number > 0 (got {t!r})")
    m = d.get("max_calls", 1)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        out.append(f"agent.max_calls must be an integer >= 1 (got {m!r})")
    if "tools" in d:
        from taurl.proxy.tools import tools_problems

        out += tools_problems(d["tools"])
    return out


def load_callable(ref: str) -> Callable[..., Any]:
    """`ref` = "file.py:function" (loaded by path) or "module:function"."""
    target, _, attr = ref.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.exists():
            raise ConfigError(f"agent.callable: no file {target!r} (relative to {os.getcwd()})")
        spec = importlib.util.spec_from_file_location(f"taurl_agent_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(target)
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ConfigError(f"agent.callable: {target!r} has no function {attr!r}")
    return fn


# ---------------------------------------------------------------------------------------
# Running one agent


async def _in_thread(fn: Callable[[], Any]) -> Any:
    """`fn()` in a daemon thread: a hung agent is abandoned at its timeout, never joined."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def run() -> None:
        try:
            res, exc = fn(), None
        except BaseException as e:  # noqa: BLE001 — handed to the episode, which records it
            res, exc = None, e
        if not loop.is_closed():
            loop.call_soon_threadsafe(lambda: (fut.done()
                                               or (fut.set_exception(exc) if exc
                                                   else fut.set_result(res))))

    threading.Thread(target=run, daemon=True, name="taurl-agent").start()
    return await fut


_AGENT_LOOP: dict[str, Any] = {}
_AGENT_LOOP_LOCK = threading.Lock()


def _agent_loop() -> asyncio.AbstractEventLoop:
    """The one event loop every ``async def`` agent runs on, for the process's life."""
    with _AGENT_LOOP_LOCK:
        loop = _AGENT_LOOP.get("loop")
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="taurl-agents", daemon=True).start()
            _AGENT_LOOP["loop"] = loop
        return loop


async def _on_agent_loop(coro: Any, timeout: float) -> Any:
    """Await `coro` on the agents' loop; at the timeout it is cancelled there."""
    return await asyncio.wait_for(
        asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, _agent_loop())), timeout)


async def _run_command(argv: Sequence[str], env: dict[str, str], timeout: float) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **env},
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)  # its whole process group: children too
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"exit status {proc.returncode}: "
                           f"{err.decode(errors='replace').strip()[-300:]}")
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


async def run_agent(agent: AgentConfig, fn: Callable | None, proxy: ProxyServer, episode_id: str,
                    prompt: str) -> tuple[str | None, str | None]:
    """(answer, error) of one agent run against the episode's base URL."""
    base = proxy.base_url(episode_id)
    retriever = f"{proxy.url}/rollouts/{episode_id}/retriever"
    tools = f"{proxy.url}/rollouts/{episode_id}/tools" if proxy.tools is not None else None
    urls = {"tools_url": tools, "mcp_url": proxy.mcp_url(episode_id),
            "anthropic_base_url": proxy.anthropic_base_url(episode_id)}
    try:
        if fn is not None:
            kw = {k: v for k, v in urls.items() if v and _takes(fn, k)}
            if inspect.iscoroutinefunction(fn):
                answer = await _on_agent_loop(fn(prompt, base, retriever, **kw), agent.timeout_s)
            else:
                answer = await asyncio.wait_for(_in_thread(lambda: fn(prompt, base, retriever,
                                                                      **kw)), agent.timeout_s)
        else:  # the command's own timeout kills its process group
            env = {"OPENAI_BASE_URL": base, "OPENAI_API_KEY": "taurl", "TAURL_TASK": prompt,
                   "ANTHROPIC_BASE_URL": urls["anthropic_base_url"], "ANTHROPIC_API_KEY": "taurl",
                   "TAURL_RETRIEVER_URL": retriever, "TAURL_EPISODE_ID": episode_id,
                   **({"TAURL_TOOLS_URL": tools, "TAURL_MCP_URL": urls["mcp_url"]} if tools
                      else {})}
            answer = await _run_command(agent.command, env, agent.timeout_s)
        return (None if answer is None else str(answer)), None
    except asyncio.TimeoutError:
        return None, f"agent timed out after {agent.timeout_s:g} s"
    except Exception as e:  # noqa: BLE001 — the agent's failure ends its episode, not the run
        return None, f"agent failed: {type(e).__name__}: {e}"


def _takes(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


# ---------------------------------------------------------------------------------------
# From captured chains to trajectories


def final_answer(content: str | None) -> str:
    """The answer in a final message: inside <answer>…</answer> when present, else all of it."""
    text = content or ""
    m = _ANSWER.findall(text)
    return (m[-1] if m else text).strip()


def _turns(chain: Chain, receipts: list, tool_errors: list) -> list[Turn]:
    turns = []
    for j, call in enumerate(chain.calls):
        nxt: Call | None = chain.calls[j + 1] if j + 1 < len(chain.calls) else None
        obs = nxt.observation_segment if nxt else None
        if call.tool_calls:
            fns = [tc["function"] for tc in call.tool_calls]
            action = {"kind": "tool_call",
                      "calls": [{"name": f["name"], "arguments": f["arguments"]} for f in fns]}
        elif call.parse in ("malformed", "too_long"):
            action = {"kind": "invalid", "parse": call.parse}
        else:
            action = {"kind": "answer", "answer": final_answer(call.content)}
        # the tools run after this call, before the next
        mine = [r for n, r in receipts if n == call.index + 1]
        errors = [e for n, e in tool_errors if n == call.index + 1]
        turns.append(Turn(index=j, action_text=call.text, action=action,
                          error="; ".join(errors) or None,
                          observation_text=(chain.codec.decode(chain.segments[obs].token_ids)
                                            if obs is not None else ""),
                          action_segment=call.action_segment, observation_segment=obs,
                          finish_reason=call.finish_reason, invalid=action["kind"] == "invalid",
                          receipt=mine[0] if mine else None, generate_s=call.generate_s))
    return turns


# Over 60 lines on purpose: one trajectory per captured chain with the episode's reward, verdict
# and stop reason decided once for all of them; split, those decisions would travel between
# helpers.
def episode_records(ep: ProxyEpisode, *, task: Any, group_id: str, run_id: str, env_name: str,
                    env_version: str,
                    verifier: Any, error: str | None, agent_name: str, answer: str | None,
                    source: str = POLICY_SOURCE, wall_s: float = 0.0) -> list[Trajectory]:
    """The episode's record: one token stream per chain (a chain of one when the agent only
    appended), its identity and stop from the last chain (the agent's final answer); ``[]``
    when no call was sampled."""
    chains = [c for c in ep.capture.chains if c.calls]
    if ep.engine_error and error is None:
        error = ep.engine_error
    agent_error = error
    # the gate or a budget refusal of the proxy ended the episode: the agent's failure after
    # that is expected (its SDK raises on the refusal), so the record is that truncation, valid
    refusal = ep.refusal if ep.gate_stop is None and not ep.engine_error else None
    if ep.gate_stop is not None or refusal is not None:
        error = None
    out = []
    for k, chain in enumerate(chains):
        last = k == len(chains) - 1
        segs = tuple(s if source == POLICY_SOURCE or s.kind != "action"
                     else Segment(s.kind, s.token_ids)
                     for s in chain.segments)
        turns = _turns(chain, ep.receipts, ep.tool_errors)
        if ep.gate_stop is not None and last:  # the gate ended it
            stop, terminated = StopReason(ep.gate_stop[0]), False
        elif refusal is not None and last:  # max_turns or context_full, as the built-in loop's
            stop, terminated = StopReason(refusal[0]), False
        elif error:
            stop, terminated = StopReason.ERROR, False
        elif not last:
            stop, terminated = StopReason("history_rewritten"), False
        elif turns[-1].action["kind"] == "answer":
            stop, terminated = StopReason.ANSWERED, True
        else:
            stop, terminated = StopReason.NO_ANSWER, True
        traj = Trajectory(
            episode_id=ep.episode_id, run_id=run_id, task_id=task.task_id,
            group_id=group_id, split=task.split, env_name=env_name, env_version=env_version,
            seed=ep.seed,
            segments=segs, turns=tuple(turns), messages=tuple(dict(m) for m in chain.render_msgs),
            terminated=terminated, truncated=not terminated, stop_reason=stop,
            timings={"wall_s": wall_s, "generate_s": sum(c.generate_s for c in chain.calls)},
            metadata={"answers": list(task.answers), "error": error, "agent": agent_name,
                      "agent_answer": answer, "agent_error": agent_error,
                      "gate_stop": ep.gate_stop[2] if ep.gate_stop else None,
                      "proxy_refusal": ep.refusal[1] if ep.refusal else None,
                      "throttled_calls": ep.throttled, "admission_waits": ep.admission_waits,
                      "admission_wait_s": ep.admission_wait_s,
                      "chains": len(chains), "malformed_calls": ep.capture.malformed_calls,
                      "sampling": sampling_record(1.0 if ep.temperature is None else ep.temperature,
                                                  ep.top_p),
                      **{key: v for key, v in task.metadata.items() if key in ("family", "hops")}},
            source=source)
        out.append(traj)
    if not out:
        return []
    # one record: the chains are its token streams, each started for its chain's reason
    out = [join_streams(out, [c.reason for c in chains[1:]])] if len(out) > 1 else out
    if ep.reward is not None:
        comps, version = dict(ep.reward_components), "agent"
    elif error or verifier is None:
        comps, version = {"outcome": 0.0}, getattr(verifier, "version", "none")
    else:
        comps, version = {"outcome": float(verifier(out[-1], task))}, verifier.version
    if ep.gate_stop is not None and ep.reward is None:
        # the host gate's penalty (a forbidden tool, a budget)
        comps["constraint"] = ep.gate_stop[1]
    # one reward for the episode, the outcome of its last chain's answer
    return [replace(t, reward=sum(comps.values()), reward_components=comps,
                    verifier_version=version) for t in out]


async def run_agent_episode(proxy: ProxyServer, agent: AgentConfig, fn: Callable | None, spec: Any,
                            *, run_id: str, env_name: str, env_version: str, verifier: Any,
                            engine: Any = None, source: str = POLICY_SOURCE) -> list[Trajectory]:
    """Open `spec`'s episode in the proxy, run the agent on its task, return its records."""
    t0 = time.perf_counter()
    ep = proxy.open(spec.episode_id, seed=spec.seed, engine=engine)
    try:
        await admitted(proxy, ep)
        answer, error = await run_agent(agent, fn, proxy, spec.episode_id, spec.task.prompt)
    finally:
        ep = proxy.pop(spec.episode_id)
    records = episode_records(ep, task=spec.task, group_id=spec.group_id, run_id=run_id,
                              env_name=env_name,
                              env_version=env_version, verifier=verifier, error=error,
                              agent_name=agent.name,
                              answer=answer, source=source, wall_s=time.perf_counter() - t0)
    if not records:  # no call was sampled: nothing to record, and the cause is what the run reports
        raise EpisodeError(no_record_cause(ep, error))
    return records


def no_record_cause(ep: ProxyEpisode, error: str | None) -> str:
    """Why an episode left no record, the proxy's refusal first (the agent's error follows from
    it)."""
    if ep.refusal is not None:
        then = f" (then {error})" if error else ""
        return (f"every model call was refused: {ep.refusal[1]}{then}; raise agent.max_calls or "
                "max_context, or shorten the agent's prompt")
    if ep.engine_error:
        return ep.engine_error
    if error:
        return f"the agent made no model call that was answered: {error}"
    if ep.throttled:
        return f"every model call was throttled ({ep.throttled} answered 429)"
    return "the agent made no model call"


async def admitted(proxy: ProxyServer, ep: ProxyEpisode) -> None:
    """Wait until the proxy's admission policy lets `ep` start (module docstring)."""
    waited = 0.0
    while (wait := proxy.admit(ep, ep.engine or proxy.engine)) is not None:
        if waited + wait > ADMISSION_PATIENCE_S:
            raise Error(f"episode {ep.episode_id!r} was not admitted within "
                        f"{ADMISSION_PATIENCE_S:g} s")
        ep.admission_waits += 1
        ep.admission_wait_s += wait
        waited += wait
        await asyncio.sleep(wait)


def proxy_limits(agent: AgentConfig, rollout: Any) -> ProxyLimits:
    return ProxyLimits(max_calls=agent.max_calls, max_action_tokens=rollout.max_action_tokens,
                       max_context=rollout.max_context, temperature=rollout.temperature)


def env_retriever(make_env: Callable[[], Any]) -> tuple[Any, Any]:
    """(env, retriever) of the run's env: the retriever service the proxy runs for agents."""
    env = make_env()
    return env, getattr(env, "retriever", None)


def cwd_on_path() -> None:
    """An agent named as "module:function" is looked up from the working directory too."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
