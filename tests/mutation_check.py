"""The mutation check: the security and cheat suites must FAIL when the protection they
guard is switched off.

    python tests/mutation_check.py            # every mutation (make mutation-check)
    python tests/mutation_check.py no-detection

A mutation is applied only by the test suite (``tests/conftest.py`` reads
``TAURL_TEST_MUTATION`` and monkeypatches; nothing under ``src/`` reads it, so no user
or config can switch a protection off by accident):

* ``no-isolation``: `Sandbox` runs each command directly on the host, same API — no
  namespaces, no bind mounts, no uid change; rlimits, the timeout and the output caps
  stay (the unsafe mode's semantics), and the sandbox still *says* it is isolated, so a
  test can only fail on what its attack did, never on that flag.
* ``no-limits``: the sandbox stays isolated but sets no rlimits (the host's own apply)
  and its /tmp and /dev/shm have no size; the wall-clock timeout and the output caps,
  enforced by the host, stay.
* ``no-detection``: the code verifier's cheat detection returns "no violation" (its
  flags are dropped before the verdict; the hidden-test run itself is unchanged).
* ``no-centering``: the learned step scorer's shaping is no longer centred per episode
  (`taurl.credit.prm.episode_neutral_shaping` with ``center=False``: the clipped step
  rewards are summed as they are), so padding and repetition can pay (the PRM canary).
* ``no-delimiting``: the judge (`taurl.reward.judge`) pastes the policy's text into its
  prompt as is — no nonce fence, no escaping — so the judge cannot tell the text it grades
  from its instructions (tests/test_judge.py's injection canaries).
* ``lax-verdict``: the judge's verdict is the first ``SCORE: n`` anywhere in its reply, not
  exactly one last line (a response that claims a score then pays).
* ``learner-version-stamp``: the async schedule stamps the engine with the learner's version
  as soon as the learner advances (`AsyncSchedule.advance` sets the engine's version), before
  the engine has loaded that version's adapter: the field's async-LoRA bug, samples of an
  older adapter labelled with a newer version (tests/test_async_lora.py must then fail).
* ``no-lockstep``: the local engine's deterministic mode no longer hears of its slots
  (`LocalEngine.join` / ``leave`` do nothing), so its steps follow timing again: two runs of
  one seed under other timing must then differ (tests/test_deterministic.py).

Each mutation runs its suites' tests with its marker (``attack``: isolation and cheats;
``limits``: resource limits) and requires every one to fail.
A test marked ``mutation_exempt(mutation, reason)`` is skipped under that mutation: a
protection the mutation keeps (rlimits, host-side checks), or an attack that would harm
the shared host if it worked there (a fork bomb, ``kill(-1)``, mounting over /tmp). The
check exits 1 if any attack test passes (it "survives") or errors for another reason.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ENV = "TAURL_TEST_MUTATION"
EXEMPT = "mutation-exempt: "
MUTATIONS = {  # name: (marker, suites)
    "no-isolation": ("attack", ("tests/test_sandbox_security.py", "tests/test_sandbox.py")),
    "no-limits": ("limits", ("tests/test_sandbox_security.py",)),
    "no-detection": ("attack", ("tests/test_cheats.py",)),
    "no-centering": ("attack", ("tests/train/test_prm_canary.py",)),
    "no-lockstep": ("attack", ("tests/test_deterministic.py",)),
    "no-delimiting": ("attack", ("tests/test_judge.py",)),
    "lax-verdict": ("attack", ("tests/test_judge.py",)),
    "learner-version-stamp": ("attack", ("tests/test_async_lora.py",)),
}


# --- the mutations (applied by tests/conftest.py) ------------------------------------


def apply(name: str, mp) -> None:
    """Switch the named protection off for this test session (`mp`: a MonkeyPatch)."""
    if name == "no-isolation":
        _no_isolation(mp)
    elif name == "no-limits":
        _no_limits(mp)
    elif name == "no-detection":
        _no_detection(mp)
    elif name == "no-centering":
        _no_centering(mp)
    elif name == "no-lockstep":
        from taurl.policy.local_engine import LocalEngine

        mp.setattr(LocalEngine, "join", lambda self, slots: None)
        mp.setattr(LocalEngine, "leave", lambda self: None)
    elif name == "no-delimiting":
        from taurl.reward import judge

        mp.setattr(judge, "quote_policy_text", lambda text, nonce: text)
    elif name == "lax-verdict":
        _lax_verdict(mp)
    elif name == "learner-version-stamp":
        _learner_version_stamp(mp)
    else:
        raise SystemExit(f"{ENV}={name!r}: unknown mutation; use one of {sorted(MUTATIONS)}")


def _learner_version_stamp(mp) -> None:
    from taurl.recipe.schedule.async_rl import AsyncSchedule

    advance = AsyncSchedule.advance

    def stamped(self, version):
        advance(self, version)
        self.engine._version = version  # the learner's number, the old adapter's weights

    mp.setattr(AsyncSchedule, "advance", stamped)


def _no_isolation(mp) -> None:
    from taurl.tools import sandbox as sbx

    init, execute = sbx.Sandbox.__init__, sbx.execute

    def host_init(self, workspace, config=None):
        cfg = config or sbx.SandboxConfig()
        init(self, workspace, dataclasses.replace(cfg, unsafe_no_isolation=True))  # run on the host
        self.config = cfg  # the caller's config, as if isolated

    async def claims_isolated(*args, **kwargs):
        return dataclasses.replace(await execute(*args, **kwargs), isolated=True)

    mp.setattr(sbx.Sandbox, "__init__", host_init)
    mp.setattr(sbx.Sandbox, "isolated", property(lambda self: True))
    mp.setattr(sbx, "execute", claims_isolated)


def _no_limits(mp) -> None:
    from taurl.tools import sandbox as sbx

    init = sbx.Sandbox.__init__

    def unlimited_init(self, workspace, config=None):
        cfg = config or sbx.SandboxConfig()
        huge = dataclasses.replace(cfg.limits, tmp_bytes=1 << 40, shm_bytes=1 << 40)
        init(self, workspace, dataclasses.replace(cfg, limits=huge))

    mp.setattr(sbx, "rlimit_args", lambda lim: [("core", (0, 0))])
    mp.setattr(sbx.Sandbox, "__init__", unlimited_init)


def _no_detection(mp) -> None:
    from taurl.envs.code.verifier import HiddenTestVerifier

    verdict = HiddenTestVerifier._verdict

    def undetected(self, score, detail, flags=(), **kwargs):
        return verdict(self, score, detail, (), **kwargs)

    mp.setattr(HiddenTestVerifier, "_verdict", undetected)


def _lax_verdict(mp) -> None:
    import re

    from taurl.reward import judge

    def first_score_anywhere(reply: str, max_score: int) -> int | None:
        m = re.search(r"SCORE: (\d+)", reply)
        return int(m.group(1)) if m and int(m.group(1)) <= max_score else None

    mp.setattr(judge, "parse_verdict", first_score_anywhere)


def _no_centering(mp) -> None:
    from taurl.credit import prm as prm_math
    from taurl.train import prm

    shaping = prm_math.episode_neutral_shaping

    def uncentred(*args, **kwargs):
        return shaping(*args, **{**kwargs, "center": False})

    mp.setattr(prm_math, "episode_neutral_shaping", uncentred)
    mp.setattr(prm, "episode_neutral_shaping", uncentred)


# --- the runner ----------------------------------------------------------------------


def run(name: str, repo: Path) -> tuple[list[str], list[str]]:
    """Run mutation `name`'s suites; print a line per attack test; (killed, problems)."""
    with tempfile.TemporaryDirectory() as d:
        xml = Path(d, "junit.xml")
        marker, suites = MUTATIONS[name]
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker,
               f"--junitxml={xml}", "-o", "junit_family=xunit1", *suites]
        env = {**os.environ, ENV: name}
        p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
        if not xml.exists():
            print(p.stdout[-4000:], p.stderr[-4000:], sep="\n")
            return [], [f"{name}: pytest produced no report (exit status {p.returncode})"]
        cases = ET.parse(xml).getroot().iter("testcase")
        killed, exempt, problems = [], [], []
        for case in cases:
            test = f"{case.get('file') or case.get('classname')}::{case.get('name')}"
            skipped, failure = case.find("skipped"), case.find("failure")
            if failure is not None:
                killed.append(test)
            elif skipped is not None and (skipped.get("message") or "").startswith(EXEMPT):
                exempt.append(f"{test} ({skipped.get('message')[len(EXEMPT):]})")
            elif case.find("error") is not None:
                problems.append(f"{test}: error (not a failure of the test itself)")
            elif skipped is not None:
                problems.append(f"{test}: skipped ({skipped.get('message')})")
            else:
                problems.append(f"{test}: SURVIVED (passed with the protection off)")
    print(f"[{name}] uid {os.geteuid()}: {len(killed)} tests failed as required, "
          f"{len(exempt)} exempt, {len(problems)} problems")
    for line in exempt:
        print(f"  exempt   {line}")
    for line in problems:
        print(f"  PROBLEM  {line}")
    if not killed:
        problems.append(f"{name}: no attack test ran")
    return killed, problems


def main(argv: list[str]) -> int:
    names = argv or list(MUTATIONS)
    unknown = sorted(set(names) - set(MUTATIONS))
    if unknown:
        print(f"unknown mutation(s) {unknown}; choose from {sorted(MUTATIONS)}", file=sys.stderr)
        return 2
    if os.environ.get("TAURL_SKIP_SANDBOX_TESTS") == "1":
        print("mutation check skipped: TAURL_SKIP_SANDBOX_TESTS=1 (no sandbox to check here)")
        return 0
    repo = Path(__file__).resolve().parents[1]
    problems = [p for n in names for p in run(n, repo)[1]]
    print("mutation check: " + ("OK, every attack test fails without its protection" if not problems
                                else f"FAILED ({len(problems)} problems)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
