"""A pool of sandboxes whose workspaces are pre-created and reset between episodes.

    pool = SandboxPool(8, template="tasks/fizzbuzz")
    async with pool.acquire() as sb:        # a workspace equal to the template
        await sb.run(["python3", "main.py"])
    # on release the workspace is reset (rm + copy of the template) before reuse

Episodes never see each other's files: a workspace goes back to the free list only
after its reset has finished, even when the episode was cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from taurl.errors import ConfigError, SandboxError
from taurl.tools import workspace as ws
from taurl.tools.sandbox import Sandbox, SandboxConfig, state_dir

log = logging.getLogger(__name__)


class SandboxPool:
    """`size` sandboxes over workspaces copied from `template` (or empty).

    acquire() waits for a free one; release (leaving the `async with`) resets it.
    `reset_s` accumulates the seconds spent resetting, `resets` counts them.
    """

    def __init__(
        self,
        size: int,
        *,
        template: str | os.PathLike | None = None,
        config: SandboxConfig | None = None,
        root: str | os.PathLike | None = None,
    ) -> None:
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"SandboxPool size must be an int >= 1 (got {size!r})")
        self.template = Path(template).resolve() if template is not None else None
        if self.template is not None and not self.template.is_dir():
            raise ConfigError(f"template {self.template} is not a directory")
        self.config = config or SandboxConfig()
        self.root = Path(
            tempfile.mkdtemp(prefix="pool-", dir=root if root is not None else state_dir())
        )
        self.root.chmod(0o711)  # the sandbox uid must reach its workspace, not list others
        self.sandboxes: list[Sandbox] = []
        self.resets = 0
        self.reset_s = 0.0
        self._free: asyncio.Queue[Sandbox] | None = None
        self._closed = False
        try:
            for i in range(size):
                path = self.root / f"ws{i}"
                ws.fill_workspace(path, self.template, self._owner())
                self.sandboxes.append(Sandbox(path, self.config))
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _owner(self) -> tuple[int, int] | None:
        if os.geteuid() != 0 or self.config.unsafe_no_isolation:
            return None
        return (self.config.host_uid, self.config.host_uid)

    @property
    def size(self) -> int:
        return len(self.sandboxes)

    def _queue(self) -> asyncio.Queue[Sandbox]:
        # Made on first use, inside the running loop that will use it.
        if self._free is None:
            self._free = asyncio.Queue()
            for sb in self.sandboxes:
                self._free.put_nowait(sb)
        return self._free

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Sandbox]:
        """Borrow a sandbox for one episode; it is reset when the block exits."""
        if self._closed:
            raise SandboxError("this SandboxPool is closed; make a new one")
        free = self._queue()
        sb = await free.get()
        try:
            yield sb
        finally:
            # Shielded, and the sandbox is returned by a callback: a cancelled episode
            # still gets its workspace reset before anyone else can take it.
            task = asyncio.ensure_future(asyncio.to_thread(self._reset, sb))
            task.add_done_callback(lambda t: self._give_back(t, sb))
            await asyncio.shield(task)

    def _give_back(self, task: asyncio.Future, sb: Sandbox) -> None:
        if task.cancelled() or task.exception() is not None:
            log.error("dropping sandbox %s from the pool: its reset failed", sb.workspace)
            self.sandboxes.remove(sb)
        else:
            self._queue().put_nowait(sb)

    def _reset(self, sb: Sandbox) -> None:
        t0 = time.perf_counter()
        try:
            ws.reset_workspace(sb.workspace, self.template, self._owner())
        except OSError as e:  # never hand out a dirty workspace: fall back to a new path
            log.warning("sandbox workspace reset failed (%s); replacing %s", e, sb.workspace)
            fresh = Path(tempfile.mkdtemp(prefix="ws-", dir=self.root))
            fresh.rmdir()
            ws.fill_workspace(fresh, self.template, self._owner())
            sb.workspace = fresh
        self.resets += 1
        self.reset_s += time.perf_counter() - t0

    def close(self) -> None:
        """Delete every workspace. Sandboxes still borrowed must not be used after this."""
        self._closed = True
        with contextlib.suppress(OSError):
            ws.clear_workspace(self.root)

    async def __aenter__(self) -> SandboxPool:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
