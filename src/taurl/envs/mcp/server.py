"""The stock-table MCP server behind mcp-v0 (a real server, written with the MCP SDK).

    python -m taurl.envs.mcp.server                          # stdio (what mcp-v0 starts)
    python -m taurl.envs.mcp.server --transport http --port 8931   # streamable HTTP on 127.0.0.1

Two tools:

* ``lookup(item)`` — the stock code of an item (read-only, closed world);
* ``write_note(item, note)`` — attach a note to an item (writes; not destructive, closed
  world): a default mcp-v0 gate grants only ``read``, so it is refused there.

Switches for failure tests (each a real failure of the process, not a flag in a reply):
``--log FILE`` appends one JSON line per call the server receives (proof of what reached
it); ``--crash-after N`` makes the process exit (``os._exit``) while serving its Nth call,
without answering; ``--hang-on TOOL`` makes that tool block its thread forever.

Imports nothing from taurl but the table (`taurl.envs.mcp.table`), so it starts as fast as
the SDK does.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from taurl.envs.mcp.table import STOCK

NOTES: dict[str, list[str]] = {}
_CALLS = [0]
_LOCK = threading.Lock()


def build(log: str | None = None, crash_after: int | None = None,
          hang_on: str | None = None) -> MCPServer:
    server = MCPServer("taurl-stock-table", log_level="WARNING")

    def received(tool: str, arguments: dict) -> None:
        with _LOCK:
            _CALLS[0] += 1
            n = _CALLS[0]
            if log:
                with open(log, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"n": n, "pid": os.getpid(), "tool": tool,
                                        "arguments": arguments}) + "\n")
        if crash_after is not None and n >= crash_after:
            os._exit(17)  # dies mid-call: the client gets no answer, the pipe closes
        if hang_on == tool:
            while True:
                time.sleep(3600)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    def lookup(item: str) -> str:
        """Look up the stock code of an item in the warehouse table.

        Args:
            item: The item's name, e.g. "copper kettle".
        """
        received("lookup", {"item": item})
        key = " ".join(item.lower().split())
        if key not in STOCK:
            # an expected error: the message reaches the client
            raise ToolError(f"no item named {item!r} in the table")
        return STOCK[key]

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                             open_world_hint=False))
    def write_note(item: str, note: str) -> str:
        """Attach a note to an item of the warehouse table.

        Args:
            item: The item's name.
            note: The note's text.
        """
        received("write_note", {"item": item, "note": note})
        NOTES.setdefault(item, []).append(note)
        return f"noted ({len(NOTES[item])} note(s) on {item})"

    return server


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    p.add_argument("--port", type=int, default=8931)
    p.add_argument("--log")
    p.add_argument("--crash-after", type=int)
    p.add_argument("--hang-on")
    a = p.parse_args(argv)
    server = build(a.log, a.crash_after, a.hang_on)
    if a.transport == "http":
        server.run("streamable-http", host="127.0.0.1", port=a.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
