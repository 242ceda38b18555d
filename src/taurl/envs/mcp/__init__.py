"""mcp-v0: tools from MCP servers behind the host gate (`taurl.tools.mcp`).

Not registered here: `taurl.envs` registers ``mcp-v0``. Importing this package loads no
MCP SDK; `env` and `server` do.
"""

from __future__ import annotations

import json
import random
from typing import Any

from taurl.envs.core import Task, task_request_problems
from taurl.envs.mcp.table import HOLDOUT, STOCK
from taurl.errors import ConfigError

SPLITS = ("train", "holdout")


def generate_tasks(split: str, n: int, seed: int = 0) -> list[Task]:
    """`n` lookup tasks of `split`, cycling over its items in a seeded order."""
    _, problems = task_request_problems(split, SPLITS, None, ["lookup"], n)
    if problems:
        raise ConfigError(problems)
    items = sorted(k for k in STOCK if (k in HOLDOUT) == (split == "holdout"))
    random.Random(seed).shuffle(items)
    return [Task(f"mcp-{split}-{seed}-{i}", f"What is the stock code of the {items[i % len(items)]}?",
                 (STOCK[items[i % len(items)]],), split, "mcp-v0", {"item": items[i % len(items)]})
            for i in range(n)]


def tool_call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def expert(task: Task, rng: random.Random) -> list[str]:
    """Look the item up, submit its code (the demonstrations SFT learns the format from)."""
    return [tool_call("table__lookup", item=task.metadata["item"]), tool_call("submit", answer=task.answers[0])]

