"""The promotion gate: each rule of `taurl.eval.promote.decide` can refuse; the record's contract;
safety and cost figures of an evaluation; and, end to end on a tiny real run, the recipe's
decision, a worse candidate refused, a promotion, `taurl rollback` and `taurl eval` of the
restored policy; every bad CLI input refused with nothing changed."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path

import pytest

from taurl.cli.main import main
from taurl.data.trajectory import Segment, StopReason, ToolReceipt, Trajectory, Turn
from taurl.errors import ConfigError, Error
from taurl.eval.evaluate import EvalResult, cost_figures, safety_figures
from taurl.eval.promote import (
    PromotionConfig,
    append_record,
    current_version,
    decide,
    promoted_versions,
    read_records,
    rollback_record,
    rollback_target,
)
from taurl.recipe.config import TrainConfig
from taurl.recipe.validate import load_config

# -- the decision ------------------------------------------------------------------------

TASKS = [f"t{i}" for i in range(10)]


def result(wins: list[int], split: str = "holdout", trials: int = 2, **figures) -> EvalResult:
    """An evaluation of TASKS with `wins[i]` successes of `trials` on task i; cost figures
    default to 100 tokens, 1 tool call and 1 s per success."""
    succ = sum(wins)
    base = {"tokens_per_success": 100.0, "tool_calls_per_success": 1.0, "wall_s_per_success": 1.0}
    return EvalResult(
        success=succ / (len(wins) * trials), ci95=(0.0, 1.0), episodes=len(wins) * trials,
        tasks=len(wins), trials=trials, pass_at_k=0.0, search_rate=0.0, tool_calls_mean=0.0,
        tokens_mean=0.0, action_tokens_mean=0.0, turns_mean=1.0, invalid_rate=0.0,
        truncation_rate=0.0, split=split, task_successes=dict(zip(TASKS, wins, strict=True)),
        eval_seed=1234, temperature=1.0, **{**base, **figures},
    )


WEAK, STRONG = [0, 1] * 5, [2, 1, 2, 2] + [2, 2, 1, 2, 2, 2]  # d = .5 or 1 per task: a clear gain


def evals(holdout: EvalResult, validation: EvalResult | None = None) -> dict[str, EvalResult]:
    return {"holdout": holdout, "validation": validation or result(STRONG, "validation")}


def test_a_clear_gain_is_promoted_and_the_record_says_why():
    d = decide(
        evals(result(STRONG)), evals(result(WEAK)), PromotionConfig(), candidate_version=3,
        baseline_version=1,
    )
    assert d.decision == "promoted" and d.current == 3 and d.baseline == 1
    gain = d.figures["holdout_gain"]
    # d_c = [1, 0, 1, .5, 1, .5, .5, .5, 1, .5]: mean .65 > 0 with a tight interval
    assert gain["difference"] == pytest.approx(0.65) and gain["ci95"][0] > 0
    assert all(r.startswith("pass ") for r in d.reasons) and len(d.reasons) == len(d.checks) == 8


def test_no_significant_gain_is_refused():
    # the same successes: d = 0 on every task, interval [0, 0], lower bound not > margin 0
    d = decide(
        evals(result(WEAK)), evals(result(WEAK)), PromotionConfig(), candidate_version=3,
        baseline_version=1,
    )
    assert d.decision == "refused" and d.current == 1
    assert [c["rule"] for c in d.checks if not c["passed"]] == ["gain"]
    assert "lower bound <= margin" in d.line()
    # a margin: +0.65 with lower bound ~0.45 fails a 0.5 margin
    d = decide(
        evals(result(STRONG)), evals(result(WEAK)), PromotionConfig(margin=0.5),
        candidate_version=3, baseline_version=1,
    )
    assert [c["rule"] for c in d.checks if not c["passed"]] == ["gain"]


@pytest.mark.parametrize("key", ["violation_rate", "cheat_rate", "gate_denials_mean"])
def test_each_safety_figure_can_refuse(key):
    cand, base = result(STRONG, **{key: 0.2}), result(WEAK, **{key: 0.1})
    d = decide(evals(cand), evals(base), PromotionConfig(), candidate_version=2, baseline_version=1)
    assert d.decision == "refused" and [c["rule"] for c in d.checks if not c["passed"]] == [
        f"safety/{key}"
    ]
    tolerant = decide(
        evals(cand), evals(base), PromotionConfig(safety_tolerance=0.1), candidate_version=2,
        baseline_version=1,
    )
    assert tolerant.decision == "promoted"


@pytest.mark.parametrize("key,ratio", [("tokens_per_success", 1.5), ("tool_calls_per_success", 1.5),
                                       ("wall_s_per_success", 2.0)])
def test_each_cost_figure_can_refuse(key, ratio):
    base = result(WEAK)
    over = result(STRONG, **{key: getattr(base, key) * ratio * 1.01})
    at = result(STRONG, **{key: getattr(base, key) * ratio})
    d = decide(evals(over), evals(base), PromotionConfig(), candidate_version=2, baseline_version=1)
    assert [c["rule"] for c in d.checks if not c["passed"]] == [f"cost/{key}"]
    assert decide(
        evals(at), evals(base), PromotionConfig(), candidate_version=2, baseline_version=1
    ).promoted


def test_cost_without_successes():
    # a baseline that never succeeded: any candidate that does is cheaper per success
    base = result(
        [0] * 10, tokens_per_success=None, tool_calls_per_success=None, wall_s_per_success=None
    )
    d = decide(
        evals(result(STRONG)), evals(base), PromotionConfig(), candidate_version=2,
        baseline_version=1,
    )
    assert d.promoted
    # a candidate that never succeeded fails every cost rule (and the gain)
    none = result(
        [0] * 10, tokens_per_success=None, tool_calls_per_success=None, wall_s_per_success=None
    )
    d = decide(evals(none), evals(result(WEAK)), PromotionConfig(margin=-1.0), candidate_version=2,
               baseline_version=1)
    assert {c["rule"] for c in d.checks if not c["passed"]} == {
        f"cost/{k}" for k in ("tokens_per_success", "tool_calls_per_success", "wall_s_per_success")
    }


def test_a_second_suite_regression_refuses():
    # validation: the candidate loses 1 of 20 episodes (−0.05, allowed) or 2 (−0.10, refused)
    v_base = result([2] * 10, "validation")
    ok = result([1] + [2] * 9, "validation")
    bad = result([1, 1] + [2] * 8, "validation")
    assert decide(
        evals(result(STRONG), ok), evals(result(WEAK), v_base), PromotionConfig(),
        candidate_version=2, baseline_version=1,
    ).promoted
    d = decide(
        evals(result(STRONG), bad), evals(result(WEAK), v_base), PromotionConfig(),
        candidate_version=2, baseline_version=1,
    )
    assert [c["rule"] for c in d.checks if not c["passed"]] == ["second_suite"]
    assert "validation (second suite) difference -0.100 < -0.050" in d.line()


def test_evaluations_of_different_tasks_or_seeds_are_not_compared():
    other = EvalResult.from_dict(
        {**result(STRONG).to_dict(), "task_successes": {f"u{i}": 1 for i in range(10)}}
    )
    with pytest.raises(Error, match="same tasks"):
        decide(
            evals(other), evals(result(WEAK)), PromotionConfig(), candidate_version=2,
            baseline_version=1,
        )
    reseeded = EvalResult.from_dict({**result(STRONG).to_dict(), "eval_seed": 7})
    with pytest.raises(Error, match="eval_seed"):
        decide(
            evals(reseeded), evals(result(WEAK)), PromotionConfig(), candidate_version=2,
            baseline_version=1,
        )


def test_promotion_options_are_validated_with_did_you_mean():
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, overrides={"promotion": {"margn": 0.1, "max_cost_ratio": "big"}})
    assert "did you mean 'margin'" in str(e.value)
    assert "max_cost_ratio must be float" in str(e.value)
    with pytest.raises(ConfigError, match="max_wall_ratio must be > 0"):
        load_config(TrainConfig, overrides={"promotion": {"max_wall_ratio": 0}})


# -- the record --------------------------------------------------------------------------

def fake_run(tmp_path: Path, versions=(0, 1, 2, 3)) -> Path:
    """A run directory's shape (config.yaml, checkpoints/v<N>/config.json) without weights:
    enough for the record and rollback, which never load a model."""
    run = tmp_path / "run"
    for v in versions:
        (run / "checkpoints" / f"v{v}").mkdir(parents=True)
        (run / "checkpoints" / f"v{v}" / "config.json").write_text("{}")
    (run / "config.yaml").write_text("env: search-v0\n")
    return run


def test_record_contract_current_and_promoted_versions(tmp_path):
    run = fake_run(tmp_path)
    assert current_version(run) == 3 and promoted_versions(run) == [] and read_records(run) == []
    d = decide(
        evals(result(STRONG)), evals(result(WEAK)), PromotionConfig(), candidate_version=2,
        baseline_version=1,
    )
    append_record(run, d)
    rec = json.loads((run / "promotions.jsonl").read_text().splitlines()[0])
    assert {
        k: type(rec[k]) for k in ("candidate", "baseline", "decision", "current", "reasons", "time")
    } == {
        "candidate": int,
        "baseline": int,
        "decision": str,
        "current": int,
        "reasons": list,
        "time": float,
    }
    assert (
        rec["decision"] == "promoted"
        and rec["figures"]["holdout_gain"]
        and rec["thresholds"]["margin"] == 0.0
    )
    assert (
        current_version(run) == 2
        and promoted_versions(run) == [1, 2]
        and rollback_target(read_records(run)) == 1
    )
    refused = decide(
        evals(result(WEAK)), evals(result(WEAK)), PromotionConfig(), candidate_version=3,
        baseline_version=2,
    )
    append_record(run, refused)
    assert current_version(run) == 2 and promoted_versions(run) == [1, 2]
    append_record(run, rollback_record(2, 1))
    assert current_version(run) == 1 and rollback_target(read_records(run)) is None
    with open(run / "promotions.jsonl", "a") as f:
        f.write('{"candidate": 3, "curr')  # a torn last line (a crash mid-append) is not trusted
    assert current_version(run) == 1 and len(read_records(run)) == 3


# -- safety and cost from the records ----------------------------------------------------

def traj(eid: str, turns: list[Turn], constraint: float = 0.0, wall: float = 2.0) -> Trajectory:
    segs = [Segment("prompt", (1, 2))] + [
        Segment("action", (3, 4, 5), (-0.1,) * 3, 0) for _ in turns
    ]
    return Trajectory(
        eid, "r", "t0", "t0", "holdout", "x-v0", "1", 0, tuple(segs), tuple(turns),
        ({"role": "user", "content": "q"},), True, False, StopReason.ANSWERED,
        reward=1.0 + constraint, reward_components={"outcome": 1.0, "constraint": constraint},
        timings={"wall_s": wall},
    )


def turn(i: int, receipt: ToolReceipt | None = None, **action) -> Turn:
    return Turn(i, "a", {"kind": "call", **action}, "", i + 1, None, "stop", receipt=receipt)


def test_safety_and_cost_figures_count_what_the_records_hold():
    denied = ToolReceipt("rm", {}, "denied", "denied", "scope: not allowed")
    failed = ToolReceipt("run", {}, "allowed", "timeout", "wall clock")
    ok = ToolReceipt("run", {}, "allowed", "ok")
    trajs = [
        traj("a", [turn(0, denied), turn(1, ok, violations=["scope"])], constraint=-1.0),
        traj(
            "b",
            [
                turn(0, failed),
                turn(1, ok, violations=["tests_modified"], cheats=["tests_modified"]),
            ],
        ),
        traj("c", [turn(0)]),
    ]
    s = safety_figures(trajs)
    assert s == {
        "violation_rate": pytest.approx(2 / 3),
        "cheat_rate": pytest.approx(1 / 3),
        "gate_denials_mean": pytest.approx(1 / 3),
        "tool_errors_mean": pytest.approx(1 / 3),
        "tool_error_rate": pytest.approx(1 / 4),
    }
    # tokens: a, b = 2 + 2·3 = 8 each, c = 5 → 21; tool calls 4; wall 6 s; over 2 successes
    c = cost_figures(trajs, successes=2)
    assert c == {"wall_s_mean": 2.0, "tokens_per_success": 10.5, "tool_calls_per_success": 2.0,
                 "wall_s_per_success": 3.0}
    assert cost_figures(trajs, successes=0)["tokens_per_success"] is None


# -- CLI bad input: a clear message, exit 1, no traceback, nothing changed ----------------

def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()} if root.exists() else {}


@pytest.mark.parametrize("args,message", [
    (["promote", "{run}", "--candidate", "v9"], "has no checkpoint v9"),
    (["promote", "{run}", "--candidate", "latest"], "takes a policy version"),
    (["promote", "{run}", "--candidate", "v2", "--baseline", "v2"], "both v2"),
    (["promote", "{run}", "--candidate", "v2", "--baseline", "v7"], "has no checkpoint v7"),
    (["promote", "{run}", "--candidate", "v3"], "name the baseline with --baseline"),
    (["promote", "{missing}", "--candidate", "v1"], "is not a training run directory"),
    (["rollback", "{run}"], "no earlier promoted version"),
    (["rollback", "{run}", "--to", "v8"], "has no checkpoint v8"),
    (["rollback", "{run}", "--to", "v3"], "already the current policy"),
    (["rollback", "{missing}"], "is not a training run directory"),
])
def test_cli_bad_input_changes_nothing(tmp_path, capsys, args, message):
    run = fake_run(tmp_path)
    missing = tmp_path / "nope"
    before = snapshot(tmp_path)
    assert main([a.format(run=run, missing=missing) for a in args]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert snapshot(tmp_path) == before and not missing.exists()


# -- end to end on a tiny real run -------------------------------------------------------

def test_recipe_decides_a_worse_candidate_is_refused_and_rollback_restores(
    tmp_path, capsys, caplog
):
    sys.path.insert(0, str(Path(__file__).parent))
    from taurl.recipe.loop import train
    from test_recipe import MINI

    # 8 holdout tasks of a 0.8M-parameter policy cannot show a significant gain, so this run
    # uses a non-inferiority margin (−0.25) to reach a promotion; the default margin's
    # refusal is tested above. Every other threshold is the default.
    cfg = TrainConfig(**{**MINI, "updates": 1, "eval_tasks": 8, "eval_trials": 2,
                         "promotion": {"margin": -0.25}})
    run = tmp_path / "run"
    # the library logs its decision; front ends show it
    with caplog.at_level(logging.INFO, logger="taurl"):
        summary = train(cfg, str(run), progress=False)
    p = summary["promotion"]
    assert p["candidate"] == 2 and p["baseline"] == 1 and p["decision"] in ("promoted", "refused")
    assert (
        f"promotion: v2 {p['decision']}" in caplog.text
        and "promotion:" not in capsys.readouterr().out
    )
    assert json.loads((run / "summary.json").read_text())["promotion"] == p
    assert read_records(run) == [p]
    assert "<h2>Promotion</h2>" in (run / "report.html").read_text()
    for split in ("holdout", "validation"):  # safety and cost next to success, in every evaluation
        for tag in ("sft", "final"):
            e = summary[split][tag]
            assert (
                e["violation_rate"] == 0.0
                and e["gate_denials_mean"] == 0.0
                and e["wall_s_mean"] > 0
            )
            assert e["eval_seed"] == cfg.eval_seed and e["temperature"] == cfg.eval_temperature
    first = current_version(run)

    # the untrained v0 against the SFT policy: refused, with the reason
    assert (
        main(["promote", str(run), "--candidate", "v0", "--baseline", "v1", "--no-progress"]) == 3
    )
    out = capsys.readouterr().out
    refused = read_records(run)[-1]
    # current unchanged
    assert refused["decision"] == "refused" and refused["current"] == first and "FAIL" in out
    assert "cost/tokens_per_success" in [c["rule"] for c in refused["checks"] if not c["passed"]]
    assert "the candidate has no success" in out
    assert sorted(f.name for f in (run / "evals").glob("promote-*")) == [
        "promote-holdout-v0.json",
        "promote-validation-v0.json",
    ]

    # the SFT policy over v0: promoted (v0's evaluations are reused, v1's are the recipe's)
    assert (
        main(["promote", str(run), "--candidate", "v1", "--baseline", "v0", "--no-progress"]) == 0
    )
    assert "promotion: v1 promoted over v0" in capsys.readouterr().out
    assert current_version(run) == 1 and len(list((run / "evals").glob("promote-*"))) == 2

    # rollback: the promoted version before v1 (v2 if the recipe promoted it, else v0)
    previous = 2 if p["decision"] == "promoted" else 0
    assert first == (2 if p["decision"] == "promoted" else 1)
    assert main(["rollback", str(run)]) == 0
    assert (
        f"v{previous} is current again" in capsys.readouterr().out
        and current_version(run) == previous
    )
    assert main(["eval", str(run), "--no-progress"]) == 0
    cap = capsys.readouterr()
    ev = json.loads(cap.out)
    assert ev["policy_version"] == previous and ev["episodes"] == 16
    assert f"v{previous} holdout: success" in cap.err and "per success" in cap.err


def test_an_evaluation_counts_cheats_denials_and_violations_recorded_at_their_source():
    """A real ToolEnv (tests/test_reward_stack.AnswerEnv): its gate's denial, the verifier's
    detected cheat (``action["cheats"]``, written by ToolEnv) reach the evaluation's figures."""
    sys.path.insert(0, str(Path(__file__).parent))
    from taurl.envs.core import Task
    from taurl.eval.evaluate import OutcomeRewardVerifier, summarize
    from taurl.reward.stack import Verdict, Violation
    from test_reward_stack import TASK, AnswerEnv, call, episode
    from test_reward_stack import tok as tok_fixture

    class CheatingVerifier:  # flags every submission as a cheat (as the code env's scan does)
        version = "cheat-v1"

        def verify(self, task, submission):
            return Verdict(
                1.0, self.version, violations=(Violation("tests_modified", "wrote the tests"),)
            )

    tok = tok_fixture.__wrapped__()
    honest = episode(tok, AnswerEnv(), [call("submit", answer="Paris")])
    denied = episode(tok, AnswerEnv(), [call("delete_all")])
    cheat = episode(tok, AnswerEnv(factory=CheatingVerifier), [call("submit", answer="Paris")])
    assert (
        cheat.turns[-1].action["cheats"] == ["tests_modified"]
        and "cheats" not in honest.turns[-1].action
    )
    tasks = [Task(f"h{i}", TASK.prompt, TASK.answers, "holdout", "answer-v0") for i in range(3)]
    trajs = [
        dataclasses.replace(t, task_id=f"h{i}", split="holdout")
        for i, t in enumerate((honest, denied, cheat))
    ]
    r = summarize(trajs, tasks, 1, verifier=OutcomeRewardVerifier())
    assert (r.violation_rate, r.cheat_rate, r.gate_denials_mean) == (
        pytest.approx(2 / 3),
        pytest.approx(1 / 3),
        pytest.approx(1 / 3),
    )
    # the cheat's outcome is voided; only the honest episode succeeds
    assert r.success == pytest.approx(1 / 3)
    assert (
        r.tokens_per_success == sum(t.num_tokens for t in trajs) and r.tool_calls_per_success == 3.0
    )
