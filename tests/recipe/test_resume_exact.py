"""Resume is exact or refused (`taurl.recipe.resume`): a run directory holds one run.

A tiny real run through the CLI (3 evaluation trials, 1 update); then resumes of it:
with ``--eval-trials 5`` (refused, the key named, nothing written), with a larger
``updates`` (it continues), and the stored evaluations and episodes are reused only
when they are what is asked for (task, seed, temperature, trials), not by id alone."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import yaml

from taurl.cli.main import main

TASKS = Path(__file__).parents[1] / "fixtures" / "chaos_tasks.jsonl"
CFG = dict(
    tasks=str(TASKS), demos=16, sft_batch_size=16, sft_epochs=1, updates=1, tasks_per_update=2,
    group_size=2, eval_tasks=2, eval_trials=3, max_turns=1, max_action_tokens=8,
    max_episode_tokens=8, warmup_options={"steps": 0}, system_prompt="", tokenizer_texts=2000,
    concurrency=8,
)


def _argv(cfg: Path, run: Path, *more: str) -> list[str]:
    return ["train", "--config", str(cfg), "--run-dir", str(run), "--no-progress", *more]


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("resume")
    cfg = root / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    assert main(_argv(cfg, root / "run")) == 0
    return cfg, root / "run"


def _copy(done, tmp_path) -> Path:
    shutil.copytree(done[1], tmp_path / "run")
    return tmp_path / "run"


def _files(run: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in run.iterdir()
        if p.is_file() and p.suffix in (".json", ".yaml", ".jsonl")
    }


def test_a_resume_with_more_eval_trials_is_refused_naming_the_key_and_writing_nothing(
    done, tmp_path, capsys
):
    """Before: config.yaml was overwritten, the stored 3-trial evaluation reused for the SFT
    policy and a 5-trial one made for the final: paired_gain divided 0-5 counts by 3."""
    run = _copy(done, tmp_path)
    before = _files(run)
    assert main(_argv(done[0], run, "--eval-trials", "5", "--updates", "2")) == 1
    err = capsys.readouterr().err
    assert "cannot be resumed with this one (changed: eval_trials: 3 -> 5)" in err
    assert (
        "only updates, rl_max_seconds, sft_max_seconds" in err and "give another --run-dir" in err
    )
    assert _files(run) == before  # refused before any file was written


def test_a_resume_with_more_updates_continues(done, tmp_path):
    run = _copy(done, tmp_path)
    assert main(_argv(done[0], run, "--updates", "2")) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train"]["updates"] == 2 and summary["holdout"]["final"]["trials"] == 3
    rl = [
        r
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if r["phase"] == "rl"
    ]
    assert [r["update"] for r in rl] == [1, 2]


def test_a_run_from_before_the_identity_was_recorded_is_checked_against_its_config_yaml(
    done, tmp_path, capsys
):
    run = _copy(done, tmp_path)
    state = json.loads((run / "state.json").read_text())
    del state["identity"]
    (run / "state.json").write_text(json.dumps(state))
    assert main(_argv(done[0], run, "--eval-trials", "5")) == 1
    assert "changed: eval_trials: 3 -> 5" in capsys.readouterr().err


def test_a_stored_evaluation_is_reused_only_when_it_is_the_one_asked_for(done, tmp_path):
    """The recipe's evaluation step, given a 5-trial config over the stored 3-trial evaluation:
    a new evaluation with episodes of its own (before: the stored one, by version alone)."""
    import dataclasses

    from taurl.recipe.config import TrainConfig
    from taurl.recipe.evaluation import evaluate_split
    from taurl.recipe.state import Run
    from taurl.recipe.validate import load_config

    run_dir = _copy(done, tmp_path)
    from taurl import envs
    from taurl.data.ledger import Ledger
    from taurl.data.runs import RunDir
    from taurl.envs.tasks import plan_tasks
    from taurl.monitor.metrics import MetricsWriter
    from taurl.rollout.seeds import episode_seed

    cfg = load_config(TrainConfig, data=CFG)
    stored = json.loads((run_dir / "evals" / "holdout-sft.json").read_text())
    plan = plan_tasks(
        cfg.env, task_file=cfg.tasks, task_options=cfg.task_options, n_demos=cfg.demos,
        n_rl=cfg.updates * cfg.tasks_per_update, n_eval=cfg.eval_tasks,
        seed=episode_seed(cfg.seed, "train"), eval_seed=cfg.eval_seed,
    )
    five = dataclasses.replace(cfg, eval_trials=5)
    with Ledger(run_dir / "ledger.sqlite") as ledger:
        r = Run(
            five, envs.spec(cfg.env), plan, RunDir(run_dir), ledger,
            MetricsWriter(run_dir / "metrics.jsonl"), progress=False,
            state=json.loads((run_dir / "state.json").read_text()),
        )
        again = evaluate_split(r, "holdout-sft", plan.holdout, stored["policy_version"])
        assert (
            stored["trials"] == 3
            and again["trials"] == 5
            and again["episodes"] == 5 * len(plan.holdout)
        )
        # the same evaluation asked again is the stored one
        r.cfg = cfg
        assert evaluate_split(
            r, "validation-sft", plan.validation, stored["policy_version"]
        ) == json.loads((run_dir / "evals" / "validation-sft.json").read_text())
        eval_ids = [e for e in ledger.episode_ids() if e.startswith("eval-holdout-sft-")]
        # none of the 3-trial ones reused
        assert len(eval_ids) == 3 * len(plan.holdout) + 5 * len(plan.holdout)


def test_a_stored_episode_of_another_task_or_seed_is_refused_not_reused(done, tmp_path):
    """A ledger episode with the id a spec asks for but another task: an error, never trained."""
    from taurl.data.ledger import Ledger
    from taurl.errors import Error
    from taurl.policy.engine import LocalEngine
    from taurl.policy.model import load_policy
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.state import make_env
    from taurl.recipe.validate import load_config
    from taurl.rollout.episodes import EpisodeSpec, collect

    run_dir = _copy(done, tmp_path)
    cfg = load_config(TrainConfig, data=CFG)
    model, tok = load_policy(run_dir / "checkpoints" / "v1")
    with Ledger(run_dir / "ledger.sqlite") as ledger:
        stored = ledger.get("r0001-000-00")
        other = next(
            t for t in (ledger.get(e) for e in ledger.episode_ids()) if t.task_id != stored.task_id
        )
        from taurl.envs.core import Task

        task = Task(other.task_id, "p", ("a",), "train", cfg.env)
        spec = EpisodeSpec("r0001-000-00", task, stored.seed, "g")
        with pytest.raises(
            Error, match=r"episode r0001-000-00 is not this run's: it has task .* \(this run: "
        ):
            asyncio.run(
                collect(
                    LocalEngine(model, tok, version=1), tok, lambda: make_env(cfg), [spec],
                    config=cfg.rollout_config(), ledger=ledger, run_id="x",
                )
            )
        same = EpisodeSpec(
            "r0001-000-00", Task(stored.task_id, "p", ("a",), "train", cfg.env), stored.seed, "g"
        )
        batch, stats = asyncio.run(
            collect(
                LocalEngine(model, tok, version=1), tok, lambda: make_env(cfg), [same],
                config=cfg.rollout_config(), ledger=ledger, run_id="x",
            )
        )
        assert batch == [stored] and stats["run/reused_episodes"] == 1
def test_a_named_or_single_file_model_has_a_fingerprint_without_being_converted(tmp_path):
    # `--model smollm2-135m-instruct` is a name, not a directory: the identity must not list it
    from taurl.recipe.resume import model_fingerprint

    assert model_fingerprint("smollm2-135m-instruct") == "name:smollm2-135m-instruct"
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    first = model_fingerprint(gguf)
    gguf.write_bytes(b"GGUF" + bytes(range(255, -1, -1)) * 10)
    assert model_fingerprint(gguf) != first
