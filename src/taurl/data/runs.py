"""The run directory: a public layout (documented in docs/formats.md).

    runs/<name>/
      config.yaml          the validated configuration of the run
      ledger.sqlite        every trajectory (append-only, SQLite WAL)
      metrics.jsonl        one JSON object per step / phase, namespaced keys
      checkpoints/v<N>/    policy version N in Hugging Face format, tokenizer included
      state.json           the recipe's resumable progress (written atomically)
      evals/<tag>.json     each evaluation's figures (written atomically)
      promotions.jsonl     promotion decisions, one JSON object per line (`current`: the
                           version made current)
      exports/             trajectory exports (JSONL / Parquet)
      report.html          plots and holdout results (training runs)
      summary.json         the final figures (training runs)
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from taurl.errors import Error

log = logging.getLogger("taurl.data.runs")


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def create(cls, root: str | Path, exist_ok: bool = True) -> RunDir:
        path = Path(root)
        if path.exists() and not exist_ok and any(path.iterdir()):
            raise Error(f"run directory {path} already exists and is not empty; pick another "
                        "--run-dir")
        path.mkdir(parents=True, exist_ok=True)
        return cls(path)

    @classmethod
    def open(cls, root: str | Path) -> RunDir:
        path = Path(root)
        if not (path / "ledger.sqlite").exists():
            raise Error(f"{path} is not a taurl run directory (no ledger.sqlite); "
                        "create one with `taurl rollout --run-dir PATH`")
        return cls(path)

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.sqlite"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def exports(self) -> Path:
        return self.root / "exports"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    def checkpoint(self, version: int) -> Path:
        return self.root / "checkpoints" / f"v{version}"

    def versions(self) -> list[int]:
        ckpts = self.root / "checkpoints"
        if not ckpts.exists():
            return []
        return sorted(int(m.group(1)) for p in ckpts.iterdir()
                      if (m := re.fullmatch(r"v(\d+)", p.name)) and (p / "config.json").exists())

    def latest_checkpoint(self) -> Path | None:
        v = self.versions()
        return self.checkpoint(v[-1]) if v else None

    @property
    def promotions(self) -> Path:
        return self.root / "promotions.jsonl"

    def promoted_versions(self) -> set[int]:
        """Every version a promotion record made ``current``, and every promotion's baseline
        (the versions `taurl rollback` may return to; none if there is no record).

        Read defensively: a line that is not a JSON object with an integer ``current`` (a
        torn last line, a hand edit) is skipped with a warning, never trusted or fatal.
        """
        if not self.promotions.exists():
            return set()
        out = set()
        for n, line in enumerate(self.promotions.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            cur = rec.get("current") if isinstance(rec, dict) else None
            if isinstance(cur, int) and not isinstance(cur, bool) and cur >= 0:
                out.add(cur)
                base = rec.get("baseline")  # the version a rollback of this promotion returns to
                if (rec.get("decision") == "promoted" and isinstance(base, int)
                    and not isinstance(base, bool)):
                    out.add(base)
            else:
                log.warning("%s line %d has no integer 'current' version; skipped", self.promotions,
                            n)
        return out

    def clean(self) -> list[str]:
        """Remove what an interrupted run left half-written (temporary checkpoints and files).

        Only dot-named temporaries are touched (`taurl.data.atomic.clean_leftovers`); a complete
        checkpoint, the ledger and every finished file stay as they are.
        """
        from taurl.data.atomic import clean_leftovers

        removed = [f"{d}/{n}" for d in ("checkpoints", "evals", ".")
                   for n in clean_leftovers(self.root / d)]
        if removed:
            log.info("removed %d leftover(s) of an interrupted run in %s: %s", len(removed),
                     self.root, ", ".join(removed))
        return removed
