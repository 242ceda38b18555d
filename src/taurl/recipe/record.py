"""What a finished update leaves behind: its alarms, its metrics row, its progress line, its hooks.

Shared by every schedule (`taurl.recipe.loop`'s synchronous one and
`taurl.recipe.schedule.async_rl`), and by a resumed run whose last row was lost to a kill
(`recover_row`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from taurl.monitor.alarms import Watch
from taurl.monitor.metrics import console_line
from taurl.policy.files import load_policy_meta
from taurl.recipe.state import Run

log = logging.getLogger("taurl.recipe.loop")


def recover_row(r: Run, version: int) -> None:
    """Write the metrics row of RL checkpoint `version` if metrics.jsonl lacks it.

    A checkpoint carries its update's row (``metrics_row`` in taurl.json; with ``schedule:
    sync`` without what is measured after the save: its timings and alarms). The row is
    appended to metrics.jsonl only after the checkpoint is whole, so a kill between the two
    leaves a checkpoint without its row. The resumed run writes it from the checkpoint,
    flagged ``run/recovered_row``, and fires the ``update_done`` hook the killed run did not
    reach."""
    meta = load_policy_meta(r.run.checkpoint(version))
    row = meta.get("metrics_row")
    if meta.get("phase") != "rl" or row is None:
        return
    update = row["update"]
    if any(x.get("phase") == "rl" and x.get("update") == update for x in r.metrics.read()):
        return
    log.warning("update %d's metrics row was lost to an interruption after its checkpoint was "
                "written; written now from checkpoint v%d", update, version)
    r.metrics.write(update, {**row, "run/recovered_row": 1.0})
    r.hook("update_done", {"update": update, "version": version})


def judge_update(r: Run, watch: Watch, row: dict[str, Any], update: int,
                 t_start: float) -> dict[str, Any] | None:
    """The alarms of an update (each adds alarm/<name> to `row` and logs a warning); the run
    state to save if RL stops after it (an alarm in ``alarms.stop_on``, the ``rl_max_seconds``
    budget), else None."""
    cfg = r.cfg
    fired = watch.observe(row)
    if (stop := watch.stops(fired)) and update < cfg.updates:
        log.warning("RL stopped after update %d of %d by alarm(s) %s (alarms.stop_on)", update,
                    cfg.updates, ", ".join(stop))
        return {"rl_stopped_early": update, "rl_stopped_by": stop}
    if (cfg.rl_max_seconds and time.perf_counter() - t_start > cfg.rl_max_seconds
        and update < cfg.updates):
        log.warning("RL cut by rl_max_seconds=%g after update %d of %d: this result depends on the "
                    "machine's speed (updates is the budget a seed fixes)", cfg.rl_max_seconds,
                    update, cfg.updates)
        return {"rl_stopped_early": update, "rl_stopped_by": ["rl_max_seconds"]}
    return None


def record_update(r: Run, bar: Any, row: dict[str, Any], update: int, version: int, t0: float,
                  write: bool = True) -> None:
    """The metrics row (unless `write` is False: a redone update's row is there already),
    progress line and ``update_done`` hook of an update whose weights serve."""
    if write:
        r.metrics.write(update, row)
    bar.update(1)
    # one line per update (shown above the bar by the front end)
    log.info(console_line(row, r.cfg.updates))
    r.hook("update_done", {"update": update, "version": version})
    r.phase_done("rl", time.perf_counter() - t0)
