"""Peak resident memory (RSS) of this process, per phase.

Linux keeps the peak RSS in ``VmHWM`` (/proc/self/status) and resets it when "5" is written
to /proc/self/clear_refs, so each phase of an update (rollout, learn, checkpoint) gets its
own peak: `PeakRSS.reset()` at its start, `PeakRSS.read_mb()` at its end. Elsewhere (no
/proc, or clear_refs not writable) the peak is the process's since it started
(``ru_maxrss``), which only grows; `resettable` says which one is reported.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


class PeakRSS:
    """Peak RSS in MB since the last `reset` (or since the process started, where it cannot reset)."""

    def __init__(self) -> None:
        self.resettable = self.reset()

    def reset(self) -> bool:
        try:
            _CLEAR.write_text("5")
            return True
        except OSError:
            return False

    def read_mb(self) -> float:
        try:
            for line in _STATUS.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
        except OSError:
            pass
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0  # bytes on macOS


def current_rss_mb() -> float:
    """The resident memory of this process now, in MB (0 where /proc is missing)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0
