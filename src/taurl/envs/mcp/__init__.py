"""mcp-v0: tools from MCP servers behind the host gate (`taurl.tools.mcp`).

Not registered here: `taurl.envs` registers ``mcp-v0``. Importing this package loads no
MCP SDK; `env` and `server` do.
"""

from __future__ import annotations

import json
import random
from typing import Any

from taurl.envs.core import Task, task_request_problems
from taurl.envs.mcp.table import SPLIT_OF, STOCK
from taurl.errors import ConfigError
from taurl.reward.exact_match import exact_match
from taurl.tools.parsers import parse_hermes

SPLITS = ("train", "validation", "holdout")


def generate_tasks(split: str, n: int, seed: int = 0) -> list[Task]:
    """`n` lookup tasks of `split` (train: 10 items, validation: 2, holdout: 4), cycling over
    its items in a seeded order."""
    _, problems = task_request_problems(split, SPLITS, None, ["lookup"], n)
    if problems:
        raise ConfigError(problems)
    items = sorted(k for k in STOCK if SPLIT_OF.get(k, "train") == split)  # splits share no item
    random.Random(seed).shuffle(items)
    return [Task(f"mcp-{split}-{seed}-{i}", "What is the stock code of the "
                                            f"{items[i % len(items)]}?",
                 (STOCK[items[i % len(items)]],), split, "mcp-v0", {"item": items[i % len(items)]})
            for i in range(n)]


def tool_call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def expert(task: Task, rng: random.Random) -> list[str]:
    """Look the item up, submit its code (the demonstrations SFT learns the format from)."""
    return [tool_call("table__lookup", item=task.metadata["item"]),
            tool_call("submit", answer=task.answers[0])]



class SubmissionVerifier:
    """The evaluator's judge of an mcp-v0 record, independent of the training reward: the
    record's last action must be an allowed ``submit`` whose answer matches the table's
    code for the task's item (exact match, SQuAD normalization)."""

    name = "mcp-submission"
    version = "mcp-submission-v1"

    def __call__(self, traj: Any, task: Task) -> float:
        if not traj.turns:
            return 0.0
        last = traj.turns[-1]
        parsed = parse_hermes(last.action_text)
        if (not parsed.ok or parsed.calls[0].name != "submit" or last.receipt is None
            or last.receipt.status != "ok"):
            return 0.0
        answer = parsed.calls[0].arguments.get("answer")
        gold = STOCK.get(task.metadata.get("item", ""))
        return exact_match(answer, [gold]) if isinstance(answer, str) and gold else 0.0
