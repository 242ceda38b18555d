"""The hidden-test runner that runs inside a fresh sandbox, and the host's reading of it.

Why it is built this way (each point closes a known verifier exploit):

* **Expected outputs never enter the sandbox.** The runner gets only the inputs; it
  calls the function and reports what came back; the host compares, in order, and stops
  at the first mismatch. Code that prints "PASS", exits early or patches the runner can
  at most change what is *reported*, and a report only passes if it holds the right
  outputs — which takes solving the task.
* **Results are JSON values.** An object whose ``__eq__`` always says True does not
  survive ``json.dumps`` (an ``int`` subclass serializes as its plain value), and a
  result whose class overrides ``__eq__`` is reported as ``eq_override``.
* **A private channel.** Before importing the solution the runner duplicates stdout to
  a private fd and points fds 1 and 2 at a capture file, so the solution's prints are
  captured (and checked for pass markers), not mixed with the report. Each report line
  starts with a per-run nonce; lines without it on stdout are forged.
* **Exits are seen.** ``SystemExit`` at import or in a call is caught and reported; an
  ``os._exit`` leaves the report without its ``done`` line. The host demands ``done``,
  every case, and exit status 0 of the runner.
* **Tampering is checked.** The runner snapshots what it relies on (builtins, ``json``,
  ``os`` and ``sys`` functions, its own code) and re-checks it after the import and
  before each case; any change, or a trace/profile hook, is reported as ``tamper``.
* **Not on disk.** The runner is passed with ``python3 -I -S -u -c`` (isolated mode: no
  site, no user site, no PYTHON* variables, script dir not on sys.path); the agent's
  workspace is not in the fresh sandbox at all: only ``solution.py`` is copied there.

`RUNNER_SHA256` pins the runner's text; the verifier refuses to run a runner whose hash
differs (an edited runner is a new verifier version).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

RUNNER = r"""
import builtins, json, os, sys
def _main():
    spec = json.loads(sys.stdin.read())
    nonce, func_name, cases = spec["nonce"], spec["func"], spec["cases"]
    chan = os.dup(1)
    cap = os.open("/tmp/.captured", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(cap, 1)
    os.dup2(cap, 2)
    os.close(cap)
    dumps, loads, write, exit_, deepcopy = json.dumps, json.loads, os.write, os._exit, __import__("copy").deepcopy
    def emit(kind, **kw):
        kw["kind"] = kind
        write(chan, (nonce + " " + dumps(kw) + "\n").encode())
    names = ("print", "isinstance", "len", "repr", "type", "getattr", "open", "__import__", "exec", "eval",
             "compile", "str", "int", "list", "dict", "callable", "BaseException", "Exception", "vars", "any")
    snap_builtins = {n: getattr(builtins, n) for n in names}
    snap_funcs = {"json.dumps": (json, "dumps", dumps), "json.loads": (json, "loads", loads),
                  "os.write": (os, "write", write), "os._exit": (os, "_exit", exit_),
                  "sys.exit": (sys, "exit", sys.exit), "os.dup2": (os, "dup2", os.dup2)}
    own_code = (_main.__code__, emit.__code__)
    plain = (int, float, str, bool, list, dict, tuple, type(None))
    def tampered():
        bad = [n for n, v in snap_builtins.items() if getattr(builtins, n, None) is not v]
        bad += [k for k, (mod, attr, v) in snap_funcs.items() if getattr(mod, attr, None) is not v]
        if (_main.__code__, emit.__code__) != own_code:
            bad.append("runner code")
        if sys.gettrace() is not None or sys.getprofile() is not None:
            bad.append("trace/profile hook")
        if sys.modules.get("json") is not json:
            bad.append("sys.modules['json']")
        return bad
    def captured():
        try:
            with builtins.open("/tmp/.captured", "rb") as f:
                return f.read(4096).decode("utf-8", "replace")
        except OSError:
            return ""
    def finish(code):
        emit("captured", text=captured())
        emit("done", code=code)
        exit_(0)
    emit("start", cases=len(cases))
    sys.path.insert(0, "/workspace")
    try:
        import solution
    except BaseException as e:
        emit("import_error", error=type(e).__name__ + ": " + str(e)[:300], exit=isinstance(e, SystemExit))
        finish(1)
    bad = tampered()
    if bad:
        emit("tamper", names=bad, when="import")
        finish(1)
    fn = getattr(solution, func_name, None)
    if not callable(fn):
        emit("import_error", error="solution.py defines no function " + func_name, exit=False)
        finish(1)
    for i, args in enumerate(cases):
        try:
            result = fn(*deepcopy(args))
        except BaseException as e:
            emit("raised", case=i, error=type(e).__name__ + ": " + str(e)[:300], exit=isinstance(e, SystemExit))
            finish(1)
        bad = tampered()
        if bad:
            emit("tamper", names=bad, when="case %d" % i)
            finish(1)
        kind = type(result)
        if kind not in plain and any("__eq__" in vars(k) for k in kind.__mro__ if k not in plain and k is not object):
            emit("eq_override", case=i, error=kind.__name__)
            finish(1)
        try:
            payload = dumps(result, allow_nan=False)
        except BaseException as e:
            emit("unserializable", case=i, error=type(result).__name__)
            finish(1)
        write(chan, (nonce + ' {"kind": "result", "case": %d, "value": ' % i + payload + "}\n").encode())
    finish(0)
_main()
"""  # noqa: E501 (the runner's text is hashed and run as it is: its lines keep their width)
RUNNER_SHA256 = hashlib.sha256(RUNNER.encode()).hexdigest()


@dataclass
class Report:
    """What the runner reported, read by the host. Frames are the nonce-prefixed lines."""

    results: dict[int, Any] = field(default_factory=dict)
    # start, import_error, raised, tamper …
    events: list[dict[str, Any]] = field(default_factory=list)
    captured: str = ""
    done: bool = False
    forged: list[str] = field(default_factory=list)  # lines that are not genuine frames

    def first(self, *kinds: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("kind") in kinds), None)


def read_report(stdout: str, nonce: str, n_cases: int) -> Report:
    """Parse the runner's stdout; anything that is not a well-formed, in-order frame is forged."""
    rep = Report()
    prefix = nonce + " "
    for line in stdout.splitlines():
        if not line.strip():
            continue
        if not line.startswith(prefix):
            rep.forged.append(line[:200])
            continue
        try:
            frame = json.loads(line[len(prefix) :])
        except (json.JSONDecodeError, RecursionError):
            rep.forged.append(line[:200])
            continue
        if not isinstance(frame, dict) or rep.done:
            rep.forged.append(line[:200])  # nothing genuine follows "done"
            continue
        kind = frame.get("kind")
        if kind == "result":
            case = frame.get("case")
            if not isinstance(case, int) or case != len(rep.results) or case >= n_cases:
                rep.forged.append(line[:200])
                continue
            rep.results[case] = frame.get("value")
        elif kind == "captured":
            rep.captured = str(frame.get("text", ""))
        elif kind == "done":
            rep.done = True
        else:
            rep.events.append(frame)
    return rep
