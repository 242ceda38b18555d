"""Progress a user can read: one bar per phase on a terminal, plain lines everywhere else.

`phase_bar` is the one progress bar of a phase (demonstrations, SFT, RL, an evaluation). On
an interactive terminal it is a tqdm bar; when stderr is not a terminal (CI, a log file,
``taurl train > log``) carriage-return bar fragments would only garble the log, so the
phase reports plain log lines instead: where it stands every `PLAIN_EVERY_S` seconds, and
once when it ends. ``progress=False`` shows neither.

Library code reports through `logging` (logger ``taurl.*``); `write` is how a line reaches
the user while a bar is on screen (above the bar, which tqdm redraws). `console_logging`
is what a front end (the CLI, `taurl.train`) installs to show those lines.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from tqdm.auto import tqdm

PLAIN_EVERY_S = 30.0  # a non-interactive phase reports where it stands this often

log = logging.getLogger("taurl.progress")


def interactive() -> bool:
    """Whether progress bars can be drawn: stderr (where tqdm draws) is a terminal."""
    stream = sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


class PlainProgress:
    """The tqdm calls taurl uses (update, close, write), as occasional plain log lines."""

    def __init__(self, total: int | None, desc: str, unit: str):
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.t0 = self._last = time.perf_counter()
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self._last >= PLAIN_EVERY_S and (self.total is None or self.n < self.total):
            self._last = now
            log.info("%s: %s %s so far (%.0f s)", self.desc, self._count(), self.unit,
                     now - self.t0)

    def set_postfix(self, *_: Any, **__: Any) -> None:  # a bar's live detail: not worth a log line
        return None

    def close(self) -> None:
        if not self._closed and self.n:
            log.info("%s: %s %s in %.1f s", self.desc, self._count(), self.unit,
                     time.perf_counter() - self.t0)
        self._closed = True

    def _count(self) -> str:
        return f"{self.n}/{self.total}" if self.total else str(self.n)

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def phase_bar(total: int | None, desc: str, unit: str = "ep", enabled: bool = True) -> Any:
    """The progress of one phase: a tqdm bar on a terminal, plain lines otherwise (module
    docstring)."""
    if enabled and interactive():
        return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr)
    if enabled:
        return PlainProgress(total, desc, unit)
    return tqdm(total=total, disable=True)


class _BarSafeHandler(logging.Handler):
    """A line above any progress bar on screen (tqdm.write): information on stdout (with the
    results, so ``taurl train > log`` keeps them), warnings and errors on stderr."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_Format())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
            tqdm.write(self.format(record), file=stream)
            stream.flush()
        except Exception:  # noqa: BLE001 — logging must never raise into the caller
            self.handleError(record)


class _Format(logging.Formatter):
    """An information line as it is (it is written for a reader); a warning says what and where."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno < logging.WARNING:
            return record.getMessage()
        return (f"{self.formatTime(record, '%H:%M:%S')} {record.levelname} {record.name}: "
                f"{record.getMessage()}")


def console_logging(level: int = logging.INFO) -> logging.Handler | None:
    """Show taurl's log lines (the per-update line, evaluations, the promotion decision, its
    warnings) above any progress bar. Installed by front ends (the CLI, `taurl.train`); a
    no-op (None) when the ``taurl`` logger or the root logger already has a handler: then
    the application decides where log lines go."""
    logger = logging.getLogger("taurl")
    if logger.handlers or logging.getLogger().handlers:
        return None
    handler = _BarSafeHandler()
    handler.previous_level = logger.level  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler


def remove_console_logging(handler: logging.Handler | None) -> None:
    """Undo `console_logging` (a front end that installed it for one call)."""
    if handler is not None:
        logger = logging.getLogger("taurl")
        logger.removeHandler(handler)
        logger.setLevel(getattr(handler, "previous_level", logging.NOTSET))
