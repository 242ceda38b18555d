"""One episode runner and one failure policy, shared by every collector: in-process
(`taurl.rollout.episodes.collect`), the async schedule, the Ray workers and the proxy's agents.

An episode ends one of two ways:

- **a record**: a `Trajectory`, stored in the ledger. A failure *inside* the episode (the
  engine, the env, a tool) is a record too: stop reason ``"error"``, counted in
  ``rollout/error_rate`` (`taurl.rollout.loop`);
- **a counted failure**: no record (the env could not be built, the agent raised, the ledger
  refused the record). It is logged with its cause and counted in
  ``rollout/failed_episodes``; the other episodes of the round go on.

A round in which no episode that ran produced a record stops the run with the first cause
(`close_round`): there is nothing to train on, and the same cause (a broken env, engine or
sandbox) would fail every later round. A group left with fewer records than episodes is
trained as it is (its advantages compare the records left) and counted in
``rollout/shrunk_groups``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from taurl.data.trajectory import Trajectory
from taurl.envs.core import episode_env
from taurl.errors import Error
from taurl.rollout.loop import RolloutConfig, run_episode

log = logging.getLogger("taurl.rollout.runner")


class EpisodeError(Error, RuntimeError):
    """No episode of a round could be run (every one raised or was refused)."""


async def run_one(engine: Any, make_env: Callable[[], Any], tokenizer: Any, spec: Any, *,
                  config: RolloutConfig, run_id: str) -> Trajectory | str:
    """The episode of `spec` (a `taurl.rollout.episodes.EpisodeSpec`), or why it produced no
    record: the one place where an episode is run, so every collector fails the same way."""
    try:
        with episode_env(make_env) as env:  # closed after the episode: a server session, a sandbox
            return await run_episode(engine, env, tokenizer, spec.task, seed=spec.seed,
                                     config=config, group_id=spec.group_id, run_id=run_id,
                                     episode_id=spec.episode_id)
    except Exception as e:  # noqa: BLE001 — a counted failure (module docstring), never the run's end
        return f"{type(e).__name__}: {e}"


def shrunk_groups(specs: Sequence[Any], recorded: Collection[str]) -> int:
    """How many groups of `specs` have some record but fewer than their episodes."""
    size = Counter(s.group_id for s in specs)
    kept = Counter(s.group_id for s in specs if s.episode_id in recorded)
    return sum(0 < kept[g] < n for g, n in size.items())


def close_round(specs: Sequence[Any], records: Mapping[str, Any], failed: Sequence[str],
                reused: Collection[str], what: str = "episode") -> dict[str, float]:
    """Log each failure, stop the run when no episode that ran produced a usable record (with
    the first cause), and return the round's failure counts as metrics.

    `records`: episode id → its record (or its chains, last one final) for the ids of `specs`
    that have one, the `reused` ones (found in the ledger) included; `failed`: one
    "<episode id>: <cause>" per episode without one. A record is usable unless an error the agent
    did not cause ended it (`Trajectory.valid`): a round of only such records (an env whose reset
    raises, a sandbox that cannot start, an engine that is down) has nothing to train on either."""
    for why in failed:
        log.warning("%s produced no record: %s", what, why)
    ran_n = sum(s.episode_id not in reused for s in specs)
    if ran_n > 0:
        new = [_final(records[s.episode_id]) for s in specs if s.episode_id in records
               and s.episode_id not in reused]
        if not new:
            raise EpisodeError(f"every one of the {ran_n} {what}(s) failed, so nothing was stored; "
                               f"the first: {failed[0] if failed else 'no cause was reported'}. "
                               "Fix the cause and run the same command again (stored episodes are "
                               "kept)")
        if not any(t.valid for t in new):
            first = failed[0] if failed else f"{new[0].episode_id}: {new[0].metadata.get('error')}"
            raise EpisodeError(f"every one of the {ran_n} {what}(s) failed or ended by an error "
                               f"the agent did not cause ({len(new)} stored as such), so there is "
                               f"nothing to train on; the first: {first}. Fix the cause and run "
                               "the same command again (stored episodes are kept)")
    return {"run/reused_episodes": float(len(reused)),
            "rollout/failed_episodes": float(len(failed)),
            "rollout/shrunk_groups": float(shrunk_groups(specs, records))}


def _final(record: Any) -> Trajectory:
    return record[-1] if isinstance(record, list) else record


def stored_episodes(ledger: Any, specs: Sequence[Any],
                    temperature: float | None) -> dict[str, Trajectory]:
    """The episodes of `specs` the ledger holds already (a resumed round), each checked to be
    the episode its spec asks for — the same task, seed and sampling temperature — not only
    one with the same id: a record of another run is refused, never trained or scored."""
    out = {}
    for s in specs:
        if s.episode_id in ledger:
            out[s.episode_id] = check_stored(ledger.get(s.episode_id), s, temperature)
    return out


def check_stored(traj: Trajectory, spec: Any, temperature: float | None) -> Trajectory:
    """`traj` if it is the episode of `spec` (`stored_episodes`), else an Error saying why."""
    stored_t = (traj.metadata.get("sampling") or {}).get("temperature")
    asked = {"task": spec.task.task_id, "seed": spec.seed, "temperature": temperature}
    found = {"task": traj.task_id, "seed": traj.seed, "temperature": stored_t}
    wrong = [k for k in asked if asked[k] is not None and found[k] is not None
             and asked[k] != found[k]]
    if wrong:
        raise Error(f"the ledger's episode {spec.episode_id} is not this run's: it has "
                    + ", ".join(f"{k} {found[k]!r} (this run: {asked[k]!r})" for k in wrong)
                    + ". The run directory holds another run's episodes: resume with that run's "
                      "configuration, or give another --run-dir")
    return traj
