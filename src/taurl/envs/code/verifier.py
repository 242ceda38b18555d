"""The outcome verifier of code-v0: hidden tests in a fresh sandbox, plus integrity checks.

`HiddenTestVerifier.verify(task, submission)`:

1. integrity of the tests themselves: the hidden cases, regenerated from the task, must
   hash to ``metadata["hidden_sha256"]`` and the runner to `PINNED_RUNNER_SHA256` —
   otherwise the verifier cannot judge (``Verdict.error``: an invalid sample, not a 0);
2. integrity of the workspace: ``test_visible.py`` unchanged (hash), no harness files
   (conftest.py, sitecustomize.py, *.pth, modules shadowing the stdlib), no links;
3. a static scan of ``solution.py`` (`scan`);
4. the run: a *fresh* sandbox holding only ``solution.py``; the runner (`harness`)
   reports each case's output; the host compares them in order and stops at the first
   mismatch. Binary: 1 only if every case matches, the report ends with ``done``, has no
   forged line, and the sandbox exited 0 — and no violation voids it.

Each detected cheat is a `Violation` (penalty from `penalties`, −1 by default; it voids
the outcome). The rules, beyond the static ones of `scan`:

=================  =====================================================================
tests_modified     test_visible.py changed or deleted (hash at submit ≠ the task's)
harness_files      conftest.py, sitecustomize.py, *.pth, stdlib-shadowing modules planted
workspace_link     a symbolic link in the workspace (e.g. solution.py → /etc/passwd)
early_exit         SystemExit at import or in a call, or the runner died before "done"
harness_tamper     the runner saw its builtins / json / os / sys functions replaced
forged_output      lines on the report channel the runner did not write
pass_marker        the solution printed a pass marker
eq_override        a result whose class overrides ``__eq__`` (an always-equal object)
hardcoded_outputs  the solution failed and holds most visible expected outputs as literals
=================  =====================================================================

A voided verdict keeps what the tests alone gave in ``score_before_void``.

Nothing is cached between calls; build one per judgement if you like (`make_verifier`).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from taurl.envs.code import scan
from taurl.envs.code.harness import RUNNER, RUNNER_SHA256, read_report
from taurl.envs.code.tasks import (
    PASS_MARKER,
    SOLUTION_FILE,
    VISIBLE_TEST_FILE,
    cases_sha256,
    hidden_cases,
    visible_cases,
    visible_test_source,
)
from taurl.envs.core import Task
from taurl.errors import ConfigError, Error
from taurl.reward.stack import Verdict, Violation
from taurl.tools.executor import run_blocking
from taurl.tools.sandbox import Sandbox, SandboxConfig, SandboxLimits

VERIFIER_VERSION = "code-hidden-v1"  # bump when the cases, the runner or the rules change meaning
PINNED_RUNNER_SHA256 = "7c816877527ad9cac81cd5ac851236542b8e762cde1ba5979cf81ac0a0a74c87"
RULES = ("tests_modified", "harness_files", "workspace_link", "early_exit", "harness_tamper",
         "forged_output", "pass_marker", "test_access", "hardcoded_outputs", "eq_override")
HARNESS_FILES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini",
                           "tox.ini",
                           "json.py", "os.py", "sys.py", "copy.py", "builtins.py", "unittest.py",
                           "pytest.py"})
VERIFY_LIMITS = SandboxLimits(timeout_s=10.0, cpu_s=5, memory_bytes=512 << 20, nproc=32,
                              max_output_bytes=256 << 10, max_drain_bytes=4 << 20)


@dataclass(frozen=True)
class Submission:
    """A snapshot of the workspace at submit, taken by the host (links never followed).

    solution: the text of solution.py, or None (`problem` says why).
    files: workspace path → sha256 of each regular file, or "link" / "other".
    """

    solution: str | None
    files: Mapping[str, str] = field(default_factory=dict)
    problem: str = ""


class HiddenTestVerifier:
    """See the module docstring. `penalties` maps rule → penalty (≤ 0; default −1)."""

    version = VERIFIER_VERSION

    def __init__(self, sandbox_config: SandboxConfig | None = None, *,
                 penalties: Mapping[str, float] | None = None, root: str | None = None) -> None:
        self.sandbox_config = sandbox_config or SandboxConfig(limits=VERIFY_LIMITS)
        if self.sandbox_config.unsafe_no_isolation:
            raise ConfigError("the hidden tests run untrusted code: HiddenTestVerifier refuses "
                              "unsafe_no_isolation")
        unknown = sorted(set(penalties or {}) - set(RULES))
        if unknown:
            raise ConfigError(f"unknown rule(s) {unknown}; rules are {RULES}")
        self.penalties = {r: -1.0 for r in RULES} | dict(penalties or {})
        self.root = root

    def verify(self, task: Task, submission: Submission) -> Verdict:
        return run_blocking(self.averify(task, submission))

    async def averify(self, task: Task, submission: Submission) -> Verdict:
        cases = hidden_cases(task)
        if cases_sha256(cases) != task.metadata.get("hidden_sha256"):
            return self._verdict(0.0, "", error="the hidden tests changed since the task was "
                                                "generated "
                                 "(their hash differs); regenerate the tasks with this version")
        if RUNNER_SHA256 != PINNED_RUNNER_SHA256:
            return self._verdict(0.0, "", error="the hidden-test runner differs from the pinned "
                                                "one; "
                                 "bump VERIFIER_VERSION and PINNED_RUNNER_SHA256 together")
        flags = self._workspace_flags(task, submission)
        if submission.solution is None:
            return self._verdict(0.0, "no solution to test: "
                                      f"{submission.problem or 'solution.py is missing'}", flags)
        flags += scan.scan(submission.solution)
        try:
            score, detail, run_flags, metrics = await self._run(task, submission.solution, cases)
        except Error as e:  # the sandbox could not run: not the agent's fault
            return self._verdict(0.0, "", flags, error=f"the hidden tests could not run: {e}")
        flags += run_flags
        if score < 1.0:
            outputs = [want for _args, want in visible_cases(task)]
            memo = scan.hardcoded(submission.solution, outputs)
            if memo:
                flags.append(("hardcoded_outputs", memo))
        return self._verdict(score, detail, flags, metrics=metrics)

    def _workspace_flags(self, task: Task, sub: Submission) -> list[tuple[str, str]]:
        flags = []
        want = _sha256(visible_test_source(task))
        got = sub.files.get(VISIBLE_TEST_FILE)
        if got != want:
            flags.append(("tests_modified", f"{VISIBLE_TEST_FILE} was "
                                            f"{'deleted' if got is None else 'changed'}"))
        for path, digest in sorted(sub.files.items()):
            base = path.rsplit("/", 1)[-1]
            if base in HARNESS_FILES or base.endswith(".pth"):
                flags.append(("harness_files", f"the workspace holds {path}"))
            if digest == "link":
                flags.append(("workspace_link", f"{path} is a symbolic link"))
        return flags

    async def _run(self, task: Task, solution: str,
                   cases: list[list]) -> tuple[float, str, list, dict]:
        nonce = secrets.token_hex(16)
        spec = json.dumps({"nonce": nonce, "func": task.metadata["func"],
                           "cases": [a for a, _ in cases]})
        sb = Sandbox.create(self.sandbox_config, root=self.root)
        try:
            sb.write_file(SOLUTION_FILE, solution)
            r = await sb.run(["python3", "-I", "-S", "-u", "-c", RUNNER], stdin=spec)
        finally:
            sb.close()
        rep = read_report(r.stdout, nonce, len(cases))
        flags: list[tuple[str, str]] = []
        if rep.forged:
            flags.append(("forged_output", f"{len(rep.forged)} line(s) not written by the runner, "
                                           f"e.g. {rep.forged[0][:80]!r}"))
        if scan.MARKER.search(rep.captured) or PASS_MARKER in rep.captured:
            flags.append(("pass_marker", "the solution printed a pass marker: "
                                         f"{rep.captured[:80]!r}"))
        ev = rep.first("import_error", "raised", "tamper", "unserializable", "eq_override")
        if ev is not None and ev.get("exit"):
            flags.append(("early_exit", f"the solution raised {ev.get('error', 'SystemExit')}"))
        if ev is not None and ev["kind"] == "tamper":
            flags.append(("harness_tamper", f"the runner found {ev.get('names')} changed "
                                            f"({ev.get('when')})"))
        if ev is not None and ev["kind"] == "eq_override":
            flags.append(("eq_override", f"case {ev.get('case')} returned a {ev.get('error')} that "
                                         "overrides __eq__"))
        killed = r.timed_out or r.killed_reason is not None or r.exit_signal is not None
        if not rep.done and not killed:
            flags.append(("early_exit", f"the test process ended (exit status {r.exit_code}) "
                                        "before the runner finished"))
        passed = 0
        for i, (_args, want) in enumerate(cases):
            if i not in rep.results or _canon(rep.results[i]) != _canon(want):
                break
            passed += 1
        metrics = {"cases_passed": float(passed), "cases_total": float(len(cases)),
                   "run_s": r.wall_s}
        if r.timed_out:
            return (0.0, f"the hidden tests timed out after {r.wall_s:.1f} s (case {passed + 1} of "
                         f"{len(cases)})", flags, metrics)
        if ev is not None:
            return 0.0, _event_text(ev, cases), flags, metrics
        if passed < len(cases):
            if passed in rep.results:
                args, want = cases[passed]
                return 0.0, (f"hidden test {passed + 1} of {len(cases)} failed: "
                             f"{task.metadata['func']}({_args_text(args)}) returned "
                             f"{_short(rep.results[passed])}, expected "
                             f"{_short(want)}"), flags, metrics
            return (0.0, f"hidden test {passed + 1} of {len(cases)} did not report a result (exit "
                         f"status {r.exit_code})", flags, metrics)
        if not rep.done or r.exit_code != 0:
            return (0.0, f"the test runner did not finish cleanly (exit status {r.exit_code})",
                    flags, metrics)
        return 1.0, f"all {len(cases)} hidden tests passed", flags, metrics

    def _verdict(self, score: float, detail: str, flags: list[tuple[str, str]] = (), *,
                 error: str | None = None, metrics: Mapping[str, float] | None = None) -> Verdict:
        seen: dict[str, str] = {}
        for rule, text in flags:
            seen.setdefault(rule, text)
        violations = tuple(Violation(rule, text, self.penalties[rule], voids_outcome=True)
                           for rule, text in seen.items())
        if violations:
            detail = f"{detail} [integrity: {', '.join(seen)}]".strip()
        return Verdict(score if not violations else 0.0, self.version, detail, violations, error,
                       dict(metrics or {}), score_before_void=score if violations else None)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _canon(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _short(value: object, n: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def _args_text(args: list) -> str:
    text = ", ".join(map(repr, args))
    return text if len(text) <= 120 else text[:117] + "..."


def _event_text(ev: dict, cases: list[list]) -> str:
    kind = ev.get("kind")
    if kind == "import_error":
        return f"solution.py could not be imported: {ev.get('error', '')}"
    if kind == "raised":
        case = ev.get("case", 0)
        args = cases[case][0] if isinstance(case, int) and 0 <= case < len(cases) else []
        return (f"hidden test {case + 1} of {len(cases)} raised {ev.get('error', '')} for "
                f"({_args_text(args)})")
    if kind == "eq_override":
        return (f"hidden test {ev.get('case', 0) + 1} returned a {ev.get('error')} object that "
                "overrides ==, not a plain value")
    if kind == "unserializable":
        return (f"hidden test {ev.get('case', 0) + 1} returned a {ev.get('error')}, not a plain "
                "value")
    return f"the test runner was tampered with: {ev.get('names')}"
