"""OpenEnv (the `openenv-core` package) environments as taurl envs.

    env: openenv
    env_config: {app: "my_pkg.server.app:app"}      # a local server the adapter starts
    env_config: {url: "http://127.0.0.1:8000"}      # or a server that already runs

Any OpenEnv server (``reset()`` / ``step(action)`` / ``state()`` over its WebSocket session,
`openenv.core.GenericEnvClient`) becomes a messages-style taurl env whose actions are tool
calls (Hermes ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``), each one checked
by taurl's host gate (`taurl.tools.gate`: unknown tool, JSON-Schema arguments, scopes,
budgets) before it reaches the server, and each leaving a `ToolReceipt`:

* an MCP env (OpenEnv's `MCPEnvironment`): its tools, listed once per env with OpenEnv's
  ``list_tools`` action, are the taurl tools; a call is OpenEnv's ``call_tool`` action;
* any other env: one tool, ``step``, whose parameters are the env's Action schema (the
  server's ``/schema``); a call is a ``step`` with those fields.

Scopes: OpenEnv's tool listing carries no annotations, so every tool needs ``read`` unless
``scopes: {TOOL: [scope, ...]}`` says otherwise, and the gate grants `gate_scopes`
(default read, write, execute): a tool given ``destructive`` is refused, with a receipt,
and never reaches the server.

Tasks are reset seeds: a seed's split is decided by its hash (`taurl.envs.gym.splits`), so
the splits never share one, and the task's prompt is the observation the server answers
to ``reset(seed=...)`` (the text of `observation_key`, or the observation as JSON). The
server's reward is the episode's reward; ``done`` ends the episode (terminated). The
evaluator's verifier replays the record's tool calls on a fresh session with the same seed
and takes the server's final reward (`OpenEnvVerifier`): the env's own judge, never the
record's stored reward. It replays only on a server (``app`` or ``url``) that a config of
this process names: a record naming any other is refused, never started or dialled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from importlib.metadata import version as package_version
from typing import Any

from taurl.envs.core import Task, seen_by_env
from taurl.envs.gym.splits import derive_seed, split_of
from taurl.envs.openenv_server_proc import server_url
from taurl.errors import ConfigError, ResetNeeded
from taurl.tools.executor import ToolBox, run_blocking
from taurl.tools.gate import Gate, GateConfig
from taurl.tools.specs import ToolSpec

NAME = "openenv-v0"  # registered as ``openenv``
VERSION = "1"
PACKAGE = "openenv-core"
OPTIONS = ("url", "app", "env_id", "observation_key", "scopes", "gate_scopes", "max_calls",
           "reset_kwargs", "max_turns", "timeout_s")


def _client(url: str, timeout_s: float) -> Any:
    try:
        from openenv.core import GenericEnvClient
    except ImportError as e:
        raise ConfigError(f"env openenv needs the openenv-core package ({e}); pip install "
                          "'taurl[ecosystem]'") from e
    return GenericEnvClient(base_url=url, message_timeout_s=timeout_s)


def observation_text(obs: dict[str, Any], key: str | None) -> str:
    """What the model reads of an observation: its `key` field, else its one string field,
    else the whole observation as JSON (tool listings left out)."""
    if key:
        return str(obs.get(key, ""))
    strings = [v for k, v in obs.items() if isinstance(v, str) and v]
    return (strings[0] if len(strings) == 1
            else json.dumps({k: v for k, v in obs.items() if k != "tools"}, default=str))


class Session:
    """One OpenEnv WebSocket session on the tools' background loop (sync and async callers).

    Connected on first use and again after `close`. Each open session holds one of the
    server's session slots (``max_concurrent_envs``: 1 unless the server raises it) until it
    is closed, so the env closes its session whenever it no longer needs it (`OpenEnvEnv`).
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.client: Any = None

    async def _call(self, what: str, *args: Any, **kwargs: Any) -> Any:
        if self.client is None:
            self.client = _client(self.url, self.timeout_s)
            await self.client.connect()
        return await getattr(self.client, what)(*args, **kwargs)

    def call(self, what: str, *args: Any, **kwargs: Any) -> Any:
        return run_blocking(self._call(what, *args, **kwargs), self.timeout_s + 5)

    async def acall(self, what: str, *args: Any, **kwargs: Any) -> Any:
        from taurl.tools.executor import _background_loop

        fut = asyncio.run_coroutine_threadsafe(self._call(what, *args, **kwargs),
                                               _background_loop())
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            with contextlib.suppress(Exception):  # a session that is gone is closed
                run_blocking(client.disconnect(), 10)

    async def aclose(self) -> None:
        """`close`, awaited (from the loop that runs an episode's `astep`)."""
        from taurl.tools.executor import _background_loop

        if self.client is not None:
            client, self.client = self.client, None
            with contextlib.suppress(Exception):  # a session that is gone is closed
                fut = asyncio.run_coroutine_threadsafe(client.disconnect(), _background_loop())
                await asyncio.wait_for(asyncio.wrap_future(fut), 10)


# The servers this process's own configs name (("app" | "url", value)): the replay verifier
# starts or connects only to one of these. A record's provenance is data, perhaps from a
# ledger someone else wrote: never a reason to import an app or dial a URL.
_CONFIGURED: set[tuple[str, str]] = set()


def _target(env_config: dict[str, Any]) -> tuple[str, str]:
    if env_config.get("app"):
        return "app", str(env_config["app"])
    return "url", str(env_config.get("url"))


def resolve(env_config: dict[str, Any], *, replay: bool = False) -> dict[str, Any]:
    """The adapter's options with the server's URL (starting a local server for ``app``).
    `replay`: the config comes from a record, so its server must be one a config of this
    process named (`_CONFIGURED`), else ConfigError."""
    unknown = sorted(set(env_config) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"env openenv has no option(s) {unknown}; its options: "
                          f"{', '.join(OPTIONS)}")
    if bool(env_config.get("url")) == bool(env_config.get("app")):
        raise ConfigError("env openenv needs exactly one of env_config 'url' (a running OpenEnv "
                          "server, e.g. http://127.0.0.1:8000) or 'app' (a 'module:attr' FastAPI "
                          "app from openenv's create_app, which the adapter starts)")
    if not replay:
        _CONFIGURED.add(_target(env_config))
    elif _target(env_config) not in _CONFIGURED:
        kind, value = _target(env_config)
        raise ConfigError(f"the record to verify names the OpenEnv {kind} {value!r}, which no "
                          "env config of this process names: the replay verifier starts or "
                          "connects only to the server your config names. Evaluate with the "
                          "config the run was trained with (its env_config names the same app or "
                          "url), or check where the ledger came from")
    url = env_config.get("url") or server_url(env_config["app"])
    return {**env_config, "url": url,
            "env_id": env_config.get("env_id") or env_config.get("app") or url}


def openenv_tasks(split: str, n: int, seed: int = 0, *,
                  env_config: dict[str, Any] | None = None) -> list[Task]:
    """`n` reset seeds of `split` (module docstring), each with the server's first observation."""
    cfg = resolve(env_config or {})
    session = Session(cfg["url"], float(cfg.get("timeout_s", 30.0)))
    out: list[Task] = []
    try:
        k = 0
        while len(out) < n:
            s = derive_seed("openenv", seed, k) % (2**31)
            k += 1
            if split_of(f"openenv-seed:{s}", (0.8, 0.1, 0.1)) != split:
                continue
            result = session.call("reset", seed=s, **cfg.get("reset_kwargs", {}))
            out.append(Task(task_id=f"seed-{s}",
                            prompt=observation_text(result.observation, cfg.get("observation_key")),
                            answers=(), split=split, env=NAME, metadata={"reset_seed": s}))
    finally:
        session.close()
    return out


class OpenEnvEnv:
    """An OpenEnv server as a taurl env (module docstring). One episode at a time.

    Its server session is open only while an episode runs: from `reset` until the episode
    ends (done, max_turns) or `close` is called (the loop's callers call it after every
    episode, `taurl.envs.core.close_env`); an env only built (for its tools, its provenance)
    holds none. A server serves ``max_concurrent_envs`` sessions at once, 1 by default.
    """

    name = NAME
    version = VERSION
    observation_style = "messages"
    stop = ("</tool_call>",)
    system_prompt = "Act with one tool call per message."

    def __init__(self, max_turns: int = 8, _replay: bool = False, **env_config: Any) -> None:
        cfg = resolve(env_config, replay=_replay)  # _replay: OpenEnvVerifier's, from a record
        self.cfg, self.max_turns = cfg, max_turns
        self.session = Session(cfg["url"], float(cfg.get("timeout_s", 30.0)))
        schema = self._tool_schemas()
        scopes = cfg.get("scopes", {})
        self.specs = [ToolSpec(name=t["name"], description=t.get("description", ""),
                               parameters=t["parameters"], fn=self._caller(t["name"]),
                               is_async=True,
                               scopes=frozenset(scopes.get(t["name"], ["read"]))) for t in schema]
        self.toolbox = ToolBox(self.specs, parser="hermes")
        self.tools = self.toolbox.declarations
        self.gate_config = GateConfig(scopes=frozenset(cfg.get("gate_scopes",
                                                               ["read", "write", "execute"])),
                                      max_calls=int(cfg.get("max_calls", 64)))
        self.verifier_version = f"openenv-core {package_version(PACKAGE)} replay"
        self.provenance = {"package": PACKAGE, "version": package_version(PACKAGE),
                           "env_id": cfg["env_id"],
                           # (the verifier's replay)
                           "mcp": self._mcp, "env_config": dict(env_config)}
        self._task: Task | None = None
        self._done, self._turn = True, 0
        self._last: Any = None  # the last StepResult of this step (reward, done)
        self.session.close()  # the tool listing is known: give the server its slot back

    def close(self) -> None:
        """End the server session (`reset` opens a new one)."""
        self.session.close()

    def _tool_schemas(self) -> list[dict[str, Any]]:
        """The env's MCP tools, or one ``step`` tool over its Action schema."""
        self.session.call("reset", seed=0)
        try:
            listing = self.session.call("step", {"type": "list_tools"})
            tools = listing.observation.get("tools") if isinstance(listing.observation,
                                                                   dict) else None
        except RuntimeError:  # a typed-action env refuses the MCP action (a validation error)
            tools = None
        self._mcp = bool(tools)
        if tools:
            return [{"name": t["name"], "description": t.get("description", ""),
                     "parameters": (t.get("input_schema") or t.get("inputSchema")
                                    or {"type": "object", "properties": {}})}
                    for t in tools]
        import httpx

        action = httpx.get(self.cfg["url"].rstrip("/") + "/schema",
                           timeout=10).json().get("action", {})
        params = {"type": "object",
                  "properties": {k: v for k, v in action.get("properties", {}).items()
                                                   if k != "metadata"},
                  "required": [r for r in action.get("required", []) if r != "metadata"]}
        return [{"name": "step", "description": action.get("description", "Take one action in the "
                                                                          "environment."),
                 "parameters": params}]

    def _caller(self, tool: str) -> Any:
        async def call(**arguments: Any) -> str:
            action = {"type": "call_tool", "tool_name": tool,
                      "arguments": arguments} if self._mcp else arguments
            self._last = result = await self.session.acall("step", action)
            obs = result.observation if isinstance(result.observation, dict) else {}
            if obs.get("error"):
                raise RuntimeError(str(obs["error"].get("message", obs["error"]))
                                   if isinstance(obs["error"], dict)
                                   else str(obs["error"]))
            if self._mcp and isinstance(obs.get("result"), dict):
                content = obs["result"].get("content") or []
                return "\n".join(str(c.get("text", c))
                                 for c in content) or json.dumps(obs["result"].get("data"))
            return observation_text(obs, self.cfg.get("observation_key"))
        return call

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if task.env != self.name or "reset_seed" not in task.metadata:
            raise ConfigError(f"task {task.task_id!r} is not an OpenEnv task; make tasks with env "
                              "openenv's task source")
        s = task.metadata["reset_seed"]
        result = self.session.call("reset", seed=s, **self.cfg.get("reset_kwargs", {}))
        self._gate = Gate(self.specs, self.gate_config, None)
        self._task, self._done, self._turn, self._last = task, bool(result.done), 0, None
        prov = {**self.provenance, "seed": s, "episode_seed": seed}
        return "", {"task_id": task.task_id, "seed": seed, "env": self.name,
                    "env_version": self.version,
                    "verifier_version": self.verifier_version, "provenance": prov}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return run_blocking(self.astep(action))

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task is None or self._done:
            raise ResetNeeded("OpenEnvEnv.step called before reset() or after the episode ended; "
                              "call reset(task) first")
        self._turn, self._last = self._turn + 1, None
        t0 = time.perf_counter()
        out = await self.toolbox.step(action, self._gate)
        info: dict[str, Any] = {"action": {"kind": "tool_call" if out.call else "invalid",
                                           **({"tool": out.call.name,
                                               "arguments": out.call.arguments}
                                              if out.call else {})},
                                "invalid": out.invalid, "turn": self._turn,
                                "latency_s": time.perf_counter() - t0}
        if out.receipt is not None:
            info["receipt"] = out.receipt
        if out.error:
            info["error"] = out.error
        reward = float(self._last.reward or 0.0) if self._last is not None else 0.0
        terminated = bool(self._last is not None and self._last.done)
        truncated = not terminated and self._turn >= self.max_turns
        if terminated or truncated:
            info.update(stop_reason="done" if terminated else "max_turns",
                        reward_components={"outcome": reward},
                        verifier_version=self.verifier_version)
            self._done = True
            await self.session.aclose()  # the episode is over: its session too
        return out.observation, reward, terminated, truncated, info


class OpenEnvVerifier:
    """Replays a record's allowed tool calls on a fresh session (same reset seed) and returns
    the server's final reward: the env's own judge, recomputed, never the stored reward."""

    name = "openenv/replay"

    def __init__(self) -> None:
        self.version = f"openenv-core {package_version(PACKAGE)} replay"
        self.calls = 0
        self._envs: dict[str, OpenEnvEnv] = {}

    def __call__(self, traj: Any, task: Task) -> float:
        self.calls += 1
        if traj.task_id != task.task_id or not traj.terminated:
            return 0.0
        cfg = {k: v for k, v in traj.provenance.get("env_config", {}).items()}
        key = json.dumps(cfg, sort_keys=True)
        # the record names the server to replay on: started or dialled only if a config of this
        # process names it too (`resolve`)
        env = self._envs.get(key) or self._envs.setdefault(
            key, OpenEnvEnv(max_turns=10**6, _replay=True, **cfg))
        env.reset(task)
        reward = 0.0
        try:
            for turn in traj.turns:
                if turn.receipt is None or turn.receipt.decision != "allowed":
                    continue
                _, reward, term, _, _ = env.step(seen_by_env(turn))
                if term:
                    break
        finally:
            env.close()  # a replay that ends before the server's done still frees its session
        return float(reward)
