"""code-v0: write a Python function in a sandboxed workspace; hidden tests decide.

Each episode gets its own sandbox (`taurl.tools.sandbox`) whose workspace holds
``solution.py`` (a stub with the spec in its docstring) and ``test_visible.py`` (three
example tests, plain Python). Tools, in Hermes ``<tool_call>`` JSON (the format of Qwen2.5's
chat template, which renders the declarations given as ``tools``):

==============  ======  ==================================================================
tool            scope   does
==============  ======  ==================================================================
write_file      write   create or replace a workspace file (host side, links refused)
read_file       read    read a workspace file (host side, links refused)
run_python      execute run code with ``python3 -`` in the episode's sandbox
run_tests       execute run ``test_visible.py`` in the episode's sandbox
submit          read    end the episode: a fresh verifier runs the hidden tests
==============  ======  ==================================================================

The reward (`HiddenTestVerifier`, `taurl.reward.stack`): outcome 1 if every hidden test
passes in a fresh sandbox (0 otherwise); each detected cheat is a constraint violation
(−1 by default) that also voids the outcome; shaping −0.02 per invalid action, +0.02
for running the visible tests, clipped to ±0.05.

``tools`` (an env option) offers a subset of them, e.g. ``[write_file, run_tests, submit]``:
the declarations the chat template renders into every prompt shrink by half (≈250 of
≈600 tokens with a small tokenizer), which is what a tiny policy trained on CPU pays for.
``submit`` must stay; the others are declared and callable only when listed.

``compact_tools`` (an env option) declares each offered tool in its shortest form: a
one-line description (`COMPACT_DESCRIPTIONS`) and each argument's name and type only (no
argument descriptions, no ``maxLength``, no ``additionalProperties``). What a call may
be does not change: the gate still validates every call against the full schema, so a
too-long or unknown argument is refused with the same message. A policy built from
scratch learns whatever format its demonstrations show; with the three tools above
the prompt drops from ≈420 to ≈250 tokens (the default tiny tokenizer; measured in
tests/test_code_env.py). The option is recorded in the provenance.

``parser`` (an env option) is how actions are read: ``hermes_or_json`` (the default since
version 2) takes the tagged calls, and when an action has no ``<tool_call>`` tag, a JSON
object with ``"name"`` and ``"arguments"``, bare or in a ```` ```json ```` fence: what
Qwen2.5-Coder-0.5B-Instruct writes zero-shot (`taurl.tools.parsers`); ``hermes`` takes
tagged calls only (version 1's reading). The error for an action without a call shows a
``write_file`` call of ``solution.py`` (`CALL_EXAMPLE`), not placeholders: a small model
copies ``"TOOL"`` and ``"ARG"`` literally. The option is recorded in the provenance.

The workspace has no disk quota of its own (it is a host directory), so after each run
the env measures it and resets it to the task's initial files when it passes
`MAX_WORKSPACE_BYTES`, telling the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taurl.envs.code.tasks import SOLUTION_FILE, VISIBLE_TEST_FILE, stub_source, visible_test_source
from taurl.envs.code.verifier import HiddenTestVerifier, Submission
from taurl.envs.core import Task
from taurl.errors import ConfigError, SandboxError
from taurl.reward.stack import Judge, RewardStack
from taurl.tools import workspace as ws
from taurl.tools.gate import GateConfig
from taurl.tools.sandbox import ExecResult, Sandbox, SandboxConfig, SandboxLimits
from taurl.tools.specs import tool
from taurl.tools.tool_env import ToolEnv

VERSION = "2"  # bump when an observation, a tool or the reward changes meaning (2: parser)
MAX_FILE_CHARS = 100_000  # the longest file write_file accepts (a schema limit)
MAX_READ_BYTES = 64 << 10
MAX_SNAPSHOT_FILES = 1000
MAX_WORKSPACE_BYTES = 32 << 20  # larger after a run: the workspace is reset and the model told
EPISODE_LIMITS = SandboxLimits(timeout_s=5.0, cpu_s=5, memory_bytes=512 << 20, nproc=32,
                               max_output_bytes=8 << 10, max_drain_bytes=4 << 20)
CODE_GATE = GateConfig(scopes=frozenset({"read", "write", "execute"}), max_calls=40,
                       max_calls_per_tool={"run_python": 20, "run_tests": 10}, max_wall_s=120.0)
CODE_STACK = RewardStack(shaping_weights={"invalid_actions": -0.02, "ran_visible_tests": 0.02},
                         shaping_clip=0.05)

SYSTEM_PROMPT = (
    "You are a careful Python programmer working in a sandboxed workspace through tools. "
    f"Write the requested function in {SOLUTION_FILE}, check it with run_tests, then call submit. "
    "Make exactly one tool call per message."
)


# what a parse error shows: one of the env's own calls, in the chat template's layout
CALL_EXAMPLE = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "solution.py", '
                '"content": "def f(x):\\n    return x\\n"}}\n</tool_call>')
PARSERS = ("hermes_or_json", "hermes")

COMPACT_DESCRIPTIONS = {
    "write_file": "Write a file.",
    "read_file": "Read a file.",
    "run_python": "Run Python code.",
    "run_tests": "Run the visible tests.",
    "submit": "Submit solution.py (ends the episode).",
}


class CodeEnv(ToolEnv):
    """See the module docstring. Construction is cheap; the sandbox is made at reset."""

    name = "code-v0"
    version = VERSION
    system_prompt = SYSTEM_PROMPT

    def __init__(self, *, max_turns: int = 12, sandbox_config: SandboxConfig | None = None,
                 gate: GateConfig | None = None, stack: RewardStack | None = None,
                 verifier_factory: Callable[[], Judge] | None = None, root: str | None = None,
                 max_output_chars: int = 4000, tools: list[str] | tuple[str, ...] | None = None,
                 compact_tools: bool = False, parser: str = "hermes_or_json") -> None:
        if not isinstance(compact_tools, bool):
            raise ConfigError(f"compact_tools must be true or false, got {compact_tools!r}")
        if parser not in PARSERS:
            raise ConfigError(f"parser must be one of {', '.join(PARSERS)}, got {parser!r}")
        self.sandbox_config = sandbox_config or SandboxConfig(limits=EPISODE_LIMITS)
        if self.sandbox_config.unsafe_no_isolation:
            raise ConfigError("code-v0 runs model-written code: it refuses unsafe_no_isolation")
        self.root = root
        self._sb: Sandbox | None = None
        all_tools = [
            tool(self.write_file, scopes=("write",), max_string_chars=MAX_FILE_CHARS),
            tool(self.read_file, scopes=("read",), max_string_chars=1000),
            tool(self.run_python, scopes=("execute",), max_string_chars=MAX_FILE_CHARS,
                 timeout_s=30.0),
            tool(self.run_tests, scopes=("execute",), timeout_s=30.0),
            tool(self.submit, scopes=("read",)),
        ]
        tools = _chosen(tools, all_tools)
        super().__init__(tools, verifier_factory=(verifier_factory
                                                  or functools.partial(HiddenTestVerifier,
                                                                       root=root)),
                         gate=gate or CODE_GATE, stack=stack or CODE_STACK, max_turns=max_turns,
                         submit_tool="submit", max_output_chars=max_output_chars,
                         parser=parser, call_example=CALL_EXAMPLE)
        self.compact_tools = compact_tools
        if compact_tools:  # what the prompt shows; the gate validates against the full schema
            self.tools = [compact_declaration(d) for d in self.tools]

    # -- tools (their docstrings are what the model reads) -----------------------------
    def write_file(self, path: str, content: str) -> str:
        """Create or replace a file in the workspace.

        Args:
            path: The file's path relative to the workspace, e.g. "solution.py".
            content: The complete new content of the file.
        """
        self._sandbox().write_file(path, content)
        return f"wrote {len(content)} characters to {path}"

    def read_file(self, path: str) -> str:
        """Read a file of the workspace.

        Args:
            path: The file's path relative to the workspace, e.g. "test_visible.py".
        """
        data = self._sandbox().read_file(path, MAX_READ_BYTES + 1)
        text = data[:MAX_READ_BYTES].decode("utf-8", errors="replace")
        return text + (f"\n[... cut at {MAX_READ_BYTES} bytes ...]" if len(data) > MAX_READ_BYTES
                       else "")

    async def run_python(self, code: str) -> str:
        """Run Python code in the workspace (python3, no network) and show its output.

        Args:
            code: The program to run, e.g. "from solution import f; print(f(3))".
        """
        return await self._exec(["python3", "-"], stdin=code)

    async def run_tests(self) -> str:
        """Run the example tests in test_visible.py against solution.py and show the report."""
        self._signals["ran_visible_tests"] = 1.0
        return await self._exec(["python3", VISIBLE_TEST_FILE])

    def submit(self) -> str:
        """Submit solution.py for grading by the hidden tests. This ends the episode."""
        return "submitted"

    async def _exec(self, argv: list[str], stdin: str | None = None) -> str:
        sb = self._sandbox()
        result = await sb.run(argv, stdin=stdin)
        # The workspace is a host directory without a quota: a run may write up to
        # RLIMIT_FSIZE per file, for as long as its time limits allow. Bound the total.
        used = await asyncio.to_thread(ws.tree_bytes, sb.workspace)
        if used > MAX_WORKSPACE_BYTES:
            await asyncio.to_thread(self._fill, sb, self._task)
            raise SandboxError(f"the workspace grew to {used >> 20} MiB, over its "
                               f"{MAX_WORKSPACE_BYTES >> 20} MiB quota; it was reset to the task's "
                               "initial files")
        return format_exec(result)

    # -- the episode's world ------------------------------------------------------------
    def _sandbox(self) -> Sandbox:
        if self._sb is None:
            raise SandboxError("no workspace: the episode has ended or not started")
        return self._sb

    def _start(self, task: Task, seed: int | None) -> dict[str, Any]:
        for key in ("family", "params", "func", "hidden_sha256"):
            if key not in task.metadata:
                raise ConfigError(f"task {task.task_id!r} lacks metadata[{key!r}]; make tasks with "
                                  "taurl.envs.code.generate_tasks")
        self._sb = Sandbox.create(self.sandbox_config, root=self.root)
        self._fill(self._sb, task)
        # provenance: the world this record ran in (the replay verifier rebuilds the same one)
        return {"workspace_files": [SOLUTION_FILE, VISIBLE_TEST_FILE],
                "provenance": {"tools": [t["function"]["name"] for t in self.tools],
                               "compact_tools": self.compact_tools,
                               "parser": self.toolbox.parser}}

    @staticmethod
    def _fill(sb: Sandbox, task: Task) -> None:
        """(Re)make the workspace as the task starts it."""
        ws.reset_workspace(sb.workspace, None, sb.owner)
        sb.write_file(SOLUTION_FILE, stub_source(task))
        sb.write_file(VISIBLE_TEST_FILE, visible_test_source(task))

    def _submission(self, value: Any = None) -> Submission:
        sb = self._sandbox()
        files = snapshot(sb.workspace)
        try:
            solution = sb.read_file(SOLUTION_FILE, MAX_FILE_CHARS * 4 + 1)
        except SandboxError as e:
            return Submission(None, files, str(e))
        if len(solution) > MAX_FILE_CHARS * 4:
            return Submission(None, files, f"{SOLUTION_FILE} is larger than {MAX_FILE_CHARS * 4} "
                                           "bytes")
        try:
            return Submission(solution.decode("utf-8"), files)
        except UnicodeDecodeError:
            return Submission(None, files, f"{SOLUTION_FILE} is not UTF-8 text")

    def _end(self) -> None:
        if self._sb is not None:
            self._sb.close()
            self._sb = None

    def __del__(self) -> None:  # an episode cut off by the rollout never reaches _end
        with contextlib.suppress(Exception):  # e.g. at interpreter shutdown
            self._end()


def compact_declaration(decl: dict[str, Any]) -> dict[str, Any]:
    """`decl` (an OpenAI function declaration) in its shortest form (module docstring)."""
    fn = decl["function"]
    params = fn["parameters"]
    props = {k: {"type": v["type"]} for k, v in params.get("properties", {}).items()}
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if params.get("required"):
        schema["required"] = list(params["required"])
    return {"type": "function", "function": {"name": fn["name"],
                                             "description": COMPACT_DESCRIPTIONS.get(
                                                 fn["name"], fn["description"]),
                                             "parameters": schema}}


def _chosen(names: list[str] | tuple[str, ...] | None, specs: list) -> list:
    """The specs named in `names` (all when None), in the env's order; bad names say how to fix."""
    if names is None:
        return specs
    known = [s.name for s in specs]
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"tools must be a list of tool names, e.g. {known}")
    problems = [f"tool {n!r} is unknown{_hint(n, known)}; code-v0's tools: {', '.join(known)}"
                for n in names if n not in known]
    if "submit" not in names:
        problems.append("tools must include 'submit' (it ends the episode)")
    if problems:
        raise ConfigError(problems)
    return [s for s in specs if s.name in set(names)]


def _hint(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def snapshot(root: Path) -> dict[str, str]:
    """workspace path → sha256 of each regular file, "link" for links, "other" otherwise.

    Walks with lstat and never follows a link (the sandbox controls these files).
    """
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            if len(out) >= MAX_SNAPSHOT_FILES:
                return out
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link"
            elif stat.S_ISREG(st.st_mode):
                out[rel] = _file_sha256(path)
            elif not stat.S_ISDIR(st.st_mode):
                out[rel] = "other"
    return out


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return "other"
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def format_exec(r: ExecResult) -> str:
    """An ExecResult as the model reads it: status, then stdout and stderr (cut)."""
    if r.timed_out:
        status = f"killed: timed out after {r.wall_s:.1f} s"
    elif r.killed_reason:
        status = f"killed: {r.killed_reason.replace('_', ' ')}"
    elif r.exit_signal:
        status = f"killed by signal {r.exit_signal}"
    else:
        status = f"exit status {r.exit_code}"
    parts = [status]
    for label, text, cut in (("stdout", r.stdout, r.truncated_stdout),
                             ("stderr", r.stderr, r.truncated_stderr)):
        if text:
            parts.append(f"--- {label}{' (cut)' if cut else ''} ---\n{text.rstrip()}")
    return "\n".join(parts)
