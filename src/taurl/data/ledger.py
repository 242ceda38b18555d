"""The ledger: an append-only, validated store of trajectories (SQLite, WAL).

    with Ledger("runs/ledger.db") as ledger:
        ledger.append(traj)                      # raises ContractError(rule=...) if broken
        report = ledger.append_many(batch)       # one transaction; rejects never abort others
        fresh = ledger.query(run_id="r1", min_version=7)

Every record is checked where it enters (docs/design.md#contracts): the rules of
`taurl.data.trajectory.check_trajectory`, the structure of the dict form (``schema``), strict
JSON (``not_json``), and the ledger's own rules — ``duplicate_episode``, and for a dict
carrying the flat export arrays ``flat_length_mismatch``, ``mask_mismatch``,
``flat_values_mismatch``, ``derived_mismatch`` (see `taurl.data.export`, which does not import
this module: the writers take any `TrajectorySource`). A refused record is
never repaired: it is written to the ``rejections`` table with its rule, so failures are
counted and explained.

Append-only is enforced by the database itself: triggers abort any UPDATE or DELETE of a
stored row and any INSERT that would replace one (``INSERT OR REPLACE``).

One connection, guarded by a lock, serves all threads of a process; other processes may
open the same file (WAL lets readers run alongside the one writer).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from taurl.data.admission import (
    _INSERT,
    _SCHEMA,
    _TRIGGERS,
    SCHEMA_VERSION,
    _admit,
    _ident,
    _row,
    _safe_text,
)
from taurl.data.trajectory import Trajectory
from taurl.errors import ConfigError, ContractError, Error, UnknownEpisodeError

_DETAIL_MAX = 4000  # characters of a rejection's detail kept in the table
_PAGE = 256  # rows per read in iter_query


@dataclass(frozen=True)
class Rejected:
    """One item of an `append_many` batch that was refused; `index` is its batch position."""

    index: int
    episode_id: str | None
    rule: str
    detail: str


@dataclass(frozen=True)
class AppendReport:
    """What `append_many` did: the ids it stored (in order) and the items it refused."""

    accepted: tuple[str, ...]
    rejected: tuple[Rejected, ...]

    @property
    def ok(self) -> bool:
        return not self.rejected

    @property
    def by_rule(self) -> dict[str, int]:
        return dict(Counter(r.rule for r in self.rejected))


@dataclass(frozen=True)
class Rejection:
    """A row of the ledger's rejections table."""

    seq: int
    created_at: float  # unix seconds
    episode_id: str | None
    run_id: str | None
    rule: str
    detail: str


# ---------------------------------------------------------------------------------------
# The store


class LedgerWriteError(Error, OSError):
    """The ledger could not commit (disk full, read-only file system): nothing of the batch was
    stored."""

    def __init__(self, path: str, e: Exception, opening: bool = False):
        what = ("(is its disk full or read-only?); the ledger file was not changed" if opening else
                "; nothing of this batch was stored (the transaction was rolled back, earlier "
                "episodes are intact)")
        super().__init__(f"cannot {'open' if opening else 'write to'} the ledger {path}: "
                         f"{e}{' ' if opening else ''}{what}. Free space and run the same command "
                         "again: the run resumes and re-samples only the missing episodes")


def _rollback(c: sqlite3.Connection) -> None:
    if c.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            # the journal undoes the transaction at the next open anyway
            c.execute("ROLLBACK")


class Ledger:
    """An append-only store of validated trajectories in one SQLite file.

    `path` is created if missing; an existing ledger is continued. ``":memory:"`` gives a
    private in-memory ledger (tests). Durability: WAL with ``synchronous=NORMAL`` — a
    crash of the process loses nothing committed; a power loss may lose the last commits
    but never corrupts the file.
    """

    def __init__(self, path: str | os.PathLike[str], timeout_s: float = 30.0):
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            self.path, timeout=timeout_s, check_same_thread=False, isolation_level=None)
        try:
            self._init_schema()
        except sqlite3.OperationalError as e:
            # the file is fine; its disk is full, read-only or failing
            self.close()
            raise LedgerWriteError(self.path, e, opening=True) from None
        except sqlite3.DatabaseError as e:
            self.close()
            raise Error(f"{self.path} is not a usable taurl ledger ({e}); give a new path or a "
                        "ledger file") from None

    def _init_schema(self) -> None:
        c = self._db()
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=NORMAL")
        version = c.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"schema version {version}, this taurl reads "
                                        f"{SCHEMA_VERSION}")
        c.executescript(_SCHEMA + _TRIGGERS.format(t="trajectories", key="episode_id")
                        + _TRIGGERS.format(t="rejections", key="seq"))
        c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise Error(f"the ledger {self.path} is closed; open it again with Ledger(path)")
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.count()

    # -- writing -----------------------------------------------------------------------
    def append(self, item: Trajectory | dict[str, Any]) -> str:
        """Store one trajectory; return its episode_id.

        Raises ContractError (its `rule` names the broken rule) if `item` breaks a
        contract; the refusal is recorded in `rejections()`.
        """
        errors: list[ContractError] = []
        report = self._append([item], errors)
        if errors:
            raise errors[0]
        return report.accepted[0]

    def append_many(self, items: Iterable[Trajectory | dict[str, Any]]) -> AppendReport:
        """Store many trajectories in one transaction.

        A refused item never stops the others: the report lists the stored ids and, for
        each refused item, its position, rule and detail (also recorded in `rejections()`).
        """
        return self._append(list(items), [])

    def _append(self, items: list[Any], errors: list[ContractError]) -> AppendReport:
        checked: list[tuple[Trajectory, str] | ContractError] = []
        for item in items:  # validation needs no lock: it touches no shared state
            try:
                checked.append(_admit(item))
            except ContractError as e:
                checked.append(e)
            except RecursionError:  # from any of the walks over a pathologically deep record
                checked.append(ContractError("not_json",
                                             "the record is nested too deeply to store"))
        accepted: list[str] = []
        rejected: list[Rejected] = []
        with self._lock:
            c = self._db()
            now = time.time()
            c.execute("BEGIN IMMEDIATE")
            try:
                seen: set[str] = set()
                for i, (item, res) in enumerate(zip(items, checked, strict=True)):
                    if not isinstance(res, ContractError):
                        res = self._insert(c, res, seen, now)
                    if isinstance(res, ContractError):
                        rej = Rejected(i, _ident(item, "episode_id"), res.rule, res.detail)
                        rejected.append(rej)
                        errors.append(res)
                        c.execute("INSERT INTO rejections (created_at, episode_id, run_id, rule, "
                                  "detail) VALUES (?, ?, ?, ?, ?)",
                                  (now, rej.episode_id, _ident(item, "run_id"),
                                                             res.rule,
                                                             _safe_text(res.detail[:_DETAIL_MAX])))
                    else:
                        accepted.append(res)
                c.execute("COMMIT")
            except sqlite3.OperationalError as e:  # disk full, read-only file system, I/O error
                _rollback(c)
                raise LedgerWriteError(self.path, e) from None
            except BaseException:
                _rollback(c)
                raise
        return AppendReport(tuple(accepted), tuple(rejected))

    @staticmethod
    def _insert(c: sqlite3.Connection, checked: tuple[Trajectory, str], seen: set[str],
                now: float) -> str | ContractError:
        traj, record = checked
        dup = ContractError("duplicate_episode", f"episode_id {traj.episode_id!r} is already "
                                                 "stored; "
                            "episode ids are unique (use a fresh uuid per episode)")
        if traj.episode_id in seen:
            return dup
        try:
            c.execute(_INSERT, _row(traj, record, now))
        except sqlite3.IntegrityError:  # the no-replace trigger or the primary key
            return dup
        seen.add(traj.episode_id)
        return traj.episode_id

    # -- reading -----------------------------------------------------------------------
    def get(self, episode_id: str) -> Trajectory:
        """The stored trajectory `episode_id`; UnknownEpisodeError if there is none."""
        with self._lock:
            row = self._db().execute("SELECT record FROM trajectories WHERE episode_id = ?",
                                     (episode_id,)).fetchone()
        if row is None:
            raise UnknownEpisodeError(f"no trajectory with episode_id {episode_id!r} in "
                                      f"{self.path}")
        return Trajectory.from_dict(json.loads(row[0]))

    def __contains__(self, episode_id: object) -> bool:
        with self._lock:
            return self._db().execute("SELECT 1 FROM trajectories WHERE episode_id = ?",
                                      (episode_id,)).fetchone() is not None

    @staticmethod
    def _where(run_id: str | None = None, split: str | None = None, task_id: str | None = None,
               group_id: str | None = None, min_version: int | None = None,
               max_version: int | None = None, env_name: str | None = None,
               valid: bool | None = None, source: str | None = None) -> tuple[list[str], list[Any]]:
        """The SQL conditions and parameters of the `query` filters."""
        conds: list[str] = []
        params: list[Any] = []
        for col, val in (("run_id", run_id), ("split", split), ("task_id", task_id),
                         ("group_id", group_id), ("env_name", env_name)):
            if val is not None:
                conds.append(f"{col} = ?")
                params.append(val)
        if min_version is not None:
            conds.append("min_version >= ?")
            params.append(min_version)
        if max_version is not None:
            conds.append("max_version <= ?")
            params.append(max_version)
        if valid is not None:
            conds.append("valid = ?")
            params.append(int(bool(valid)))
        if source is not None:  # read from the record: records older than the field are "policy"
            conds.append("COALESCE(json_extract(record, '$.source'), 'policy') = ?")
            params.append(source)
        return conds, params

    def iter_query(self, *, limit: int | None = None, **filters: Any) -> Iterator[Trajectory]:
        """Stream the matching trajectories in insertion order, `_PAGE` rows at a time.

        Filters: see `query`. The lock is held only while a page is read, so other threads
        may append meanwhile; rows they append may appear at the end of the stream.
        """
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 0):
            raise ConfigError(f"limit must be a non-negative integer or None, got {limit!r}")
        conds, params = self._where(**filters)
        last, left = 0, limit
        while left is None or left > 0:
            page = _PAGE if left is None else min(_PAGE, left)
            sql = ("SELECT seq, record FROM trajectories WHERE " + " AND ".join([*conds, "seq > ?"])
                   + " ORDER BY seq LIMIT ?")
            with self._lock:
                rows = self._db().execute(sql, (*params, last, page)).fetchall()
            for _, record in rows:
                yield Trajectory.from_dict(json.loads(record))
            if len(rows) < page:
                return
            last = rows[-1][0]
            left = None if left is None else left - len(rows)

    def query(self, *, run_id: str | None = None, split: str | None = None,
              task_id: str | None = None, group_id: str | None = None,
              min_version: int | None = None, max_version: int | None = None,
              env_name: str | None = None, valid: bool | None = None, source: str | None = None,
              limit: int | None = None) -> list[Trajectory]:
        """The matching trajectories in insertion order; the filters combine with AND.

        min_version=v keeps trajectories whose every action was sampled by version >= v
        (the staleness filter: ``min_version=current - eta``); max_version=v those whose
        every action version is <= v. A trajectory without action segments has no
        version and is left out by both — so are records no policy sampled (expert
        demonstrations). source="policy" keeps only policy-sampled records (RL's input);
        source="expert" only demonstrations.
        """
        return list(self.iter_query(run_id=run_id, split=split, task_id=task_id, group_id=group_id,
                                    min_version=min_version, max_version=max_version,
                                    env_name=env_name, valid=valid, source=source, limit=limit))

    def count(self, **filters: Any) -> int:
        """How many stored trajectories match (filters as in `query`, without limit)."""
        conds, params = self._where(**filters)
        sql = "SELECT COUNT(*) FROM trajectories" + (" WHERE " + " AND ".join(conds) if conds
                                                     else "")
        with self._lock:
            return self._db().execute(sql, params).fetchone()[0]

    def episode_ids(self, *, limit: int | None = None, **filters: Any) -> list[str]:
        """The matching episode ids in insertion order."""
        conds, params = self._where(**filters)
        sql = ("SELECT episode_id FROM trajectories" + (" WHERE " + " AND ".join(conds) if conds
                                                        else "")
               + " ORDER BY seq" + (" LIMIT ?" if limit is not None else ""))
        with self._lock:
            rows = self._db().execute(
                sql, [*params, *([limit] if limit is not None else [])]).fetchall()
        return [r[0] for r in rows]

    def rejections(self, *, run_id: str | None = None, rule: str | None = None) -> list[Rejection]:
        """The recorded refusals, oldest first."""
        conds, params = [], []
        for col, val in (("run_id", run_id), ("rule", rule)):
            if val is not None:
                conds.append(f"{col} = ?")
                params.append(val)
        sql = ("SELECT seq, created_at, episode_id, run_id, rule, detail FROM rejections"
               + (" WHERE " + " AND ".join(conds) if conds else "") + " ORDER BY seq")
        with self._lock:
            return [Rejection(*r) for r in self._db().execute(sql, params).fetchall()]

    def stats(self, run_id: str | None = None) -> dict[str, Any]:
        """Summary of the stored episodes (of one run, or all).

        episodes, valid, terminated, truncated: counts; mean_reward: mean of `reward`
        (None without episodes); stop_reasons: count per reason; num_tokens,
        num_action_tokens, num_turns: sums; rejected / rejected_by_rule: refusals.
        """
        where, params = ("WHERE run_id = ?", [run_id]) if run_id is not None else ("", [])
        with self._lock:
            c = self._db()
            n, mean, valid, term, trunc, toks, atoks, turns = c.execute(
                "SELECT COUNT(*), AVG(reward), SUM(valid), SUM(terminated), SUM(truncated), "
                "SUM(num_tokens), SUM(num_action_tokens), SUM(num_turns) FROM trajectories "
                f"{where}",
                params).fetchone()
            reasons = c.execute(f"SELECT stop_reason, COUNT(*) FROM trajectories {where} "
                                "GROUP BY stop_reason ORDER BY stop_reason", params).fetchall()
            rules = c.execute(f"SELECT rule, COUNT(*) FROM rejections {where} GROUP BY rule ORDER "
                              "BY rule",
                              params).fetchall()
        return {
            "episodes": n, "valid": valid or 0, "terminated": term or 0, "truncated": trunc or 0,
            "mean_reward": mean, "stop_reasons": dict(reasons),
            "num_tokens": toks or 0, "num_action_tokens": atoks or 0, "num_turns": turns or 0,
            "rejected": sum(k for _, k in rules), "rejected_by_rule": dict(rules),
        }
