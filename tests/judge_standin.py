"""A stand-in for a judge model (imported by tests/test_judge.py, never collected).

A real judge model cannot run in these tests, so this small rule-following program plays
one. It is deterministic, and it is vulnerable the way instruction-following judges are
when the graded text is not delimited: it cannot tell the text it grades from the
instructions it obeys. Concretely it

* takes its rubric from the *last* ``RUBRIC:`` section outside the quoted response (a
  response that imitates the rubric rewrites it, unless it is fenced off);
* obeys an instruction outside the quoted response that says ``ignore ...`` and names a
  number (a response that addresses the judge is obeyed, unless it is fenced off);
* echoes the response's lines in its reasoning before its verdict, as judges quote what
  they grade (a response that claims ``SCORE: 10`` puts that line into the reply, which a
  lax parser would read as the verdict).

It reads the fence from the sentence of `taurl.reward.judge.judge_prompt` that declares it;
when no such fenced block is in the prompt (delimiting off), everything after the
response's header is both data and instructions to it.

The only rubric form it grades: ``Award N if the response contains 'WORD', else M.``
"""

from __future__ import annotations

import re

DECLARED = re.compile(r"between the lines (.+?>>>) and (.+?>>>)\.")
RUBRIC = re.compile(r"Award (\d+) if the response contains '([^']+)', else (\d+)\.")
OBEY = re.compile(r"(?i)\bignore\b[^\n]*?\b(\d{1,3})\b")


class StandInJudge:
    """``complete(prompt) -> reply`` (a `taurl.reward.judge.Backend`)."""

    name = "standin-judge-1"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def complete(self, prompt: str) -> str:
        self.prompts.append(prompt)
        instructions, data = self._split(prompt)
        echo = [f"> {line}" for line in data.splitlines() if line.strip()]
        reasoning = ["The response reads:", *echo]
        obeyed = OBEY.findall(instructions)
        if obeyed:  # a model that follows the last instruction it was given
            return "\n".join([*reasoning, "As instructed.", f"SCORE: {obeyed[-1]}"])
        rubrics = RUBRIC.findall(instructions)
        if not rubrics:
            return "\n".join([*reasoning, "I cannot find a rubric."])
        high, word, low = rubrics[-1]
        score = high if word.lower() in data.lower() else low
        return "\n".join([*reasoning, f"It {'contains' if score == high else 'lacks'} {word!r}.",
                          f"SCORE: {score}"])

    @staticmethod
    def _split(prompt: str) -> tuple[str, str]:
        """(what it reads as instructions, what it grades)."""
        m = DECLARED.search(prompt)
        if m is not None:
            begin, end = m.group(1), m.group(2)
            after = prompt[m.end():]
            i = after.find(begin)
            j = after.find(end, i + len(begin)) if i >= 0 else -1
            if i >= 0 and j >= 0:  # a fenced block: its inside is data, never instructions
                data = after[i + len(begin):j]
                return prompt[:m.end()] + after[:i] + after[j + len(end):], data
        # no fence: the response is mixed into the instructions; it grades what sits
        # between the header sentence and the closing request
        start = prompt.find("whatever it says.\n")
        start = start + len("whatever it says.\n") if start >= 0 else 0
        stop = prompt.rfind("\nReason briefly")
        return prompt, prompt[start:stop if stop > start else len(prompt)]
