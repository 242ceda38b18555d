"""Resume: a run killed during RL continues from its last version, no episode lost or duplicated.

The crash is real: the recipe raises from inside the rollout phase, after some episodes of
update 2 are in the ledger and before the others exist (the same state a kill -9 leaves,
since every episode is committed to SQLite as it finishes). The restart must reuse the
stored ones, sample exactly the missing ones with the same version, and go on.
"""

from __future__ import annotations

import json

import pytest

from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train

CFG = TrainConfig(
    demos=16, sft_batch_size=16, sft_epochs=1, updates=3, tasks_per_update=2, group_size=3,
    eval_tasks=2, eval_trials=1, max_turns=1, max_action_tokens=8, max_episode_tokens=8,
    task_options={"families": ["country_continent"], "split_by": "country"},
    warmup_options={"steps": 0}, system_prompt="", tokenizer_texts=2000, concurrency=8,
)
PER_ROUND = 2 * 3


class Crash(Exception):
    pass


def test_killed_during_rl_resumes_without_losing_or_duplicating_episodes(tmp_path):
    run_dir = tmp_path / "run"
    seen: list[tuple[str, dict]] = []

    def hook(name, info):
        seen.append((name, info))
        stored = [
            i for n, i in seen if n == "episode_stored" and i["episode_id"].startswith("r0002-")
        ]
        # 4 of update 2's 6 are stored: die before more
        if name == "episode_finished" and len(stored) >= 4:
            raise Crash("killed")

    with pytest.raises(Crash):
        train(CFG, str(run_dir), progress=False, hook=hook)
    run = RunDir(run_dir)
    assert run.versions() == [0, 1, 2]  # the SFT policy and update 1; update 2 never finished
    with Ledger(run.ledger) as ledger:
        before = {e for e in ledger.episode_ids() if e.startswith("r")}
        stored_before = {e: ledger.get(e).to_dict() for e in before}
    partial = len(before) - PER_ROUND
    assert partial == 4

    summary = train(CFG, str(run_dir), progress=False)
    assert summary["train"]["updates"] == 3
    # retention: v0, the SFT version and the newest two (keep_checkpoints)
    assert run.versions() == [0, 1, 3, 4]
    with Ledger(run.ledger) as ledger:
        ids = [e for e in ledger.episode_ids() if e.startswith("r")]
        assert len(ids) == len(set(ids)) == 3 * PER_ROUND  # none lost, none twice
        for e in before:  # what was stored before the crash is untouched
            assert ledger.get(e).to_dict() == stored_before[e]
        for u in (1, 2, 3):
            versions = {
                v
                for i in range(2)
                for g in range(3)
                for v in ledger.get(f"r{u:04d}-{i:03d}-{g:02d}").policy_versions
            }
            assert versions == {u}  # round u sampled by version u, before and after the restart
        assert ledger.count() == len(ledger.episode_ids())
        assert not ledger.rejections()
    rows = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    grpo = [r for r in rows if r["phase"] == "rl"]
    assert [r["update"] for r in grpo] == [1, 2, 3]
    assert grpo[1]["run/reused_episodes"] == partial  # update 2 reused what it had stored
    # SFT's one step was not run again
    assert [r["step"] for r in rows if r["phase"] == "sft"] == [1]
    assert json.loads((run.checkpoint(4) / "taurl.json").read_text())["update"] == 3
