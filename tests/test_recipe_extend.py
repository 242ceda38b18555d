"""A run extended with more updates evaluates its new final version afresh.

`evaluate_split` keeps each evaluation in evals/<tag>.json and its episodes in the ledger,
so a resumed run never evaluates twice. When the run is extended (``--updates`` raised
after it finished), the stored "final" evaluation is of an older version: it must be
redone, with episode ids of its own (the old ids would fetch the old version's episodes).
`evaluate_policy` is replaced by a recorder here: what is under test is the bookkeeping.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from taurl.recipe import evaluation as recipe


class FakeResult:
    def __init__(self, version: int):
        self.version, self.success, self.ci95, self.episodes, self.tasks, self.trials = (
            version, 0.5, (0.4, 0.6), 4, 2, 2,
        )
        self.pass_at_k = 0.5

    def to_dict(self):
        return {"policy_version": self.version, "success": self.success}

    def metrics(self, prefix):
        return {f"{prefix}/success": self.success}


def test_an_extended_run_re_evaluates_its_new_final_version(tmp_path, monkeypatch):
    calls = []

    def fake_evaluate(path, tasks, ecfg, *, tag, **kw):
        calls.append((str(path), tag))
        return FakeResult(int(str(path).rsplit("v", 1)[1]))

    monkeypatch.setattr(recipe, "evaluate_policy", fake_evaluate)
    (tmp_path / "evals").mkdir()
    cfg = SimpleNamespace(
        eval_config=lambda: None, rollout_config=lambda t: None, eval_temperature=1.0, agent={},
        eval_trials=2, eval_seed=0,
    )
    r = SimpleNamespace(
        run=SimpleNamespace(root=tmp_path, checkpoint=lambda v: tmp_path / f"v{v}"),
        cfg=cfg,
        make_env=None,
        spec=SimpleNamespace(make_verifier=lambda: None),
        ledger=None,
        progress=False,
        metrics=SimpleNamespace(write=lambda *a: None),
        phase_done=lambda *a: None,
        placement=lambda: ("cpu", None),
    )
    assert recipe.evaluate_split(r, "holdout-final", [], 21)["policy_version"] == 21
    # a resume reuses it
    assert recipe.evaluate_split(r, "holdout-final", [], 21)["policy_version"] == 21
    # extended: evaluated again
    assert recipe.evaluate_split(r, "holdout-final", [], 31)["policy_version"] == 31
    assert [tag for _, tag in calls] == ["holdout-final", "holdout-final-v31"]
    assert (
        json.loads((tmp_path / "evals" / "holdout-final.json").read_text())["policy_version"] == 31
    )
