"""A reference-matching judge: the policy's answer compared with the task's reference answers.

    judge = ReferenceJudge(answer_pattern=r"<answer>(.*?)</answer>")
    judge.score(task, policy_text)      # JudgeResult: reward = round(10 * similarity) / 10
    judge(traj, task)                   # an outcome ``(traj, task) -> reward`` for the recipe

What it sees, and nothing else: the task's reference answers (``task.answers``) and the text
the policy wrote (every action's text, joined). With `answer_pattern` it grades the last
match of that pattern (group 1), and a text with no match scores 0; without one it grades the
whole text. It never sees the env's reward, the record's flags (terminated, stop reason), the
observations, or the env's verifier.

How it compares (not the verifier's rule, which is exact match after SQuAD normalization):
both strings are folded (NFKD, combining marks dropped, casefolded, every run of
non-alphanumerics one space) and compared with difflib's ratio 2·M / (|a| + |b|) (M: the
matched characters of Ratcliff/Obershelp's longest-common-subsequence heuristic, Python's
`difflib.SequenceMatcher`); the score is the best ratio over the references, rounded to
``max_score`` steps. So a near-miss ("Spian" for "Spain") gets partial credit where exact
match gives 0, and a wrong country scores what its spelling shares with the right one.

It reads no instructions, so text addressed to a judge cannot move it; the injection
canaries in tests/test_judged_reward.py check that they score no more than a plain wrong
answer. Deterministic; the verdict is cached under (version, task prompt, references, graded
text); ``version`` changes with the pattern, the scale or `FORMAT`.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import threading
import unicodedata
from typing import Any

from taurl.errors import ConfigError
from taurl.reward.judge import JudgeResult
from taurl.reward.stack import Verdict

FORMAT = "reference-fuzzy-1"  # change when `fold`, `similarity` or the scoring changes
_NON_ALNUM = re.compile(r"[^0-9a-z]+")


def fold(text: str) -> str:
    """`text` folded for comparison: accents dropped, casefolded, punctuation as spaces."""
    decomposed = unicodedata.normalize("NFKD", text)
    bare = "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()
    return _NON_ALNUM.sub(" ", bare).strip()


def similarity(a: str, b: str) -> float:
    """difflib's ratio 2·M / (|a| + |b|) of the folded strings (1.0: equal; 0.0 if one is
    empty). Source: Python's `difflib.SequenceMatcher.ratio`."""
    fa, fb = fold(a), fold(b)
    if not fa or not fb:
        return 0.0
    return difflib.SequenceMatcher(None, fa, fb, autojunk=False).ratio()


class ReferenceJudge:
    """The judge of the module docstring: `score`, an outcome `__call__`, the stack's `verify`."""

    name = "reference-judge"

    def __init__(self, *, answer_pattern: str | None = None, max_score: int = 10):
        if not 1 <= max_score <= 999:
            raise ConfigError(f"max_score must be in [1, 999], got {max_score!r}")
        try:
            self.pattern = re.compile(answer_pattern, re.DOTALL) if answer_pattern else None
        except re.error as e:
            raise ConfigError(f"answer_pattern {answer_pattern!r} is not a regex: {e}") from None
        self.max_score = max_score
        digest = hashlib.blake2b(f"{answer_pattern or ''}\x00{max_score}".encode(),
                                 digest_size=6).hexdigest()
        self.version = f"judge:{FORMAT}:{digest}"
        self._cache: dict[str, JudgeResult] = {}
        self._lock = threading.Lock()
        self.stats = {"judge/calls": 0, "judge/cache_hits": 0, "judge/no_answer": 0}

    def graded_text(self, policy_text: str) -> str | None:
        """What is compared: the last match's group 1 (None: no match), or the whole text."""
        if self.pattern is None:
            return policy_text
        matches = list(self.pattern.finditer(policy_text))
        if not matches:
            return None
        last = matches[-1]
        return last.group(1) if last.groups() else last.group(0)

    def score(self, task: Any, policy_text: str) -> JudgeResult:
        references = tuple(getattr(task, "answers", ()) or ())
        prompt = str(getattr(task, "prompt", task))
        graded = self.graded_text(policy_text)
        key = hashlib.blake2b("\x00".join((self.version, prompt, *references, "\x01",
                                           graded if graded is not None else "\x02")).encode(),
                              digest_size=16).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self.stats["judge/cache_hits"] += 1
                return JudgeResult(hit.reward, hit.score, hit.reply, hit.version, cached=True)
        if graded is None:
            n, reply = 0, "no answer found"
        else:
            best = max((similarity(graded, ref) for ref in references), default=0.0)
            n, reply = round(self.max_score * best), f"similarity {best:.3f}"
        result = JudgeResult(n / self.max_score, n, reply, self.version, cached=False)
        with self._lock:
            self.stats["judge/calls"] += 1
            self.stats["judge/no_answer"] += graded is None
            self._cache[key] = result
        return result

    def verify(self, task: Any, submission: Any) -> Verdict:
        """`taurl.reward.stack.Judge`: the judged outcome of `submission` for `task`."""
        if not isinstance(submission, str):
            return Verdict(0.0, self.version, "no text was submitted")
        r = self.score(task, submission)
        return Verdict(r.reward, self.version, f"score {r.score}/{self.max_score}: {r.reply}")

    def __call__(self, traj: Any, task: Any) -> float:
        """An outcome ``(traj, task) -> reward`` over the record's action texts."""
        return self.score(task, "".join(t.action_text for t in traj.turns)).reward
