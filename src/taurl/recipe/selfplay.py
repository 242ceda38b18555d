"""Self-play on tictactoe-v0: SFT, then RL from matches of the policy against itself, scored
against a scripted opponent that no stage trains on (configs/tictactoe_selfplay.yaml).

    python -m taurl.recipe.selfplay --config configs/tictactoe_selfplay.yaml --run-dir R

Stages (docs/multi-agent.md, "Self-play"):

1. a tokenizer and the tiny policy built from the training games' texts; with
   ``sft.warmup_demos`` a legal-move warm-up first (SFT on games of uniform legal moves:
   with ``game.numbered`` the policy learns to copy a free cell's number off the board, the
   copy a policy built from scratch has no heads for), then SFT on expert
   demonstrations played against ``demo_opponent`` (a uniform random player);
2. ``rl.updates`` rounds: each round plays ``group_size`` matches of ``tasks_per_update``
   openings with the policy in both seats (x and o), credits the records (``zero_sum``
   by default: a match's two records get S_i − mean of the match) and updates. With
   ``policy.lora.per_role: true`` each role has its own LoRA adapter over the SFT base
   (`taurl.train.role_adapters`): x's engine serves x's adapter, and x's rows train only it;
3. evaluation before and after RL through the single-agent face against two scripted
   opponents nobody trains on: ``validation`` (the one settings are chosen on) and
   ``holdout`` (reported only), each on its own split of openings and seeds, k trials per
   game, success = a win, task-clustered intervals and the paired gain (`taurl.eval`).

Writes ``summary.json`` in the run directory: the four evaluations, the paired gains and
per-update metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from taurl.data.ledger import Ledger
from taurl.envs.core import Task
from taurl.envs.games.rules import other
from taurl.envs.games.tictactoe import (
    SYSTEM_PROMPT,
    TicTacToeEnv,
    TicTacToeGame,
    tictactoe_expert,
    tictactoe_tasks,
)
from taurl.envs.multiagent import Seat
from taurl.errors import ConfigError
from taurl.eval.evaluate import EvalResult, compare, summarize
from taurl.policy.files import save_policy
from taurl.policy.local_engine import LocalEngine
from taurl.policy.model import build_default_policy, load_policy
from taurl.rollout.budgets import RolloutConfig
from taurl.rollout.episodes import EpisodeSpec, collect
from taurl.rollout.match import run_matches
from taurl.rollout.seeds import episode_seed
from taurl.rollout.synth import demonstrations
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.lora import LoraOptions, attach, merged
from taurl.train.role_adapters import RoleLearners, attach_roles, role_policy
from taurl.train.sft import train_sft

ROLES = ("x", "o")


@dataclass
class SelfPlayConfig:
    """configs/tictactoe_selfplay.yaml, its sections flattened (`SECTIONS`); unknown keys
    are refused."""

    seed: int = 0
    vocab_size: int = 512
    opening_moves: list[int] = field(default_factory=lambda: [0, 2])
    max_illegal: int = 2  # the referee: the 2nd invalid move of a game forfeits it
    illegal_penalty: float = 0.0  # self-play only: a step reward of -this per invalid move
    numbered: bool = False  # the board shows each empty cell's number (the legal moves)
    demos: int = 2000
    demo_opponent: dict[str, Any] = field(
        default_factory=lambda: {"opponent": "random", "opponent_p_random": 1.0})
    expert_p_random: float = 0.1
    # a legal-move warm-up before SFT: games of uniform legal moves (the rules, no strategy)
    warmup_demos: int = 0
    warmup_epochs: int = 1
    sft_epochs: int = 4
    sft_batch_size: int = 32
    sft_lr: float = 3e-3
    updates: int = 20
    tasks_per_update: int = 16
    group_size: int = 4
    estimator: str = "zero_sum"
    estimator_options: dict[str, Any] = field(default_factory=dict)  # e.g. {gamma: 0.5}
    rl_lr: float = 1e-3
    kl_coef: float = 0.0  # β of KL(π ‖ SFT policy) in the loss (`LearnerConfig.kl_coef`)
    entropy_coef: float = 0.0  # entropy bonus (`LearnerConfig.entropy_coef`)
    rl_epochs: int = 1  # optimizer steps on each round's batch (PPO epochs)
    lora: dict[str, Any] = field(default_factory=dict)  # {} full; {rank, alpha, per_role}
    validation_opponent: dict[str, Any] = field(
        default_factory=lambda: {"opponent": "minimax", "opponent_p_random": 0.75})
    holdout_opponent: dict[str, Any] = field(
        default_factory=lambda: {"opponent": "minimax", "opponent_p_random": 0.5})
    # more reports on the holdout split, each against its own opponent: {name: opponent}
    extra_holdout: dict[str, dict[str, Any]] = field(default_factory=dict)
    # also play validation and holdout against the frozen SFT checkpoint (`evaluate_frozen`)
    frozen_opponent: bool = False
    eval_tasks: int = 200
    eval_trials: int = 4
    temperature: float = 1.0

    @classmethod
    def load(cls, path: str | Path, overrides: Sequence[str] = ()) -> SelfPlayConfig:
        """The YAML's sections (`SECTIONS`) flattened onto the fields; `overrides` are
        ``section.key=YAML`` (or ``key=YAML`` at the top level), applied in order."""
        raw = yaml.safe_load(Path(path).read_text()) or {}
        for item in overrides:
            dotted, _, value = item.partition("=")
            *outer, key = dotted.split(".")
            node = raw
            for name in outer:
                node = node.setdefault(name, {})
            node[key] = yaml.safe_load(value)
        flat: dict[str, Any] = {}
        for key, value in raw.items():
            if key in SECTIONS:
                if not isinstance(value, dict):
                    raise ConfigError(f"{path}: {key} must be a mapping")
                for inner, v in value.items():
                    if inner not in SECTIONS[key]:
                        raise ConfigError(f"{path}: unknown key {key}.{inner}; "
                                          f"{key} takes {sorted(SECTIONS[key])}")
                    flat[SECTIONS[key][inner]] = v
            elif key in ("seed",):
                flat[key] = value
            else:
                raise ConfigError(f"{path}: unknown key {key!r}; sections {sorted(SECTIONS)}")
        return cls(**flat)


# section -> {key in the YAML: field of SelfPlayConfig}
SECTIONS: dict[str, dict[str, str]] = {
    "game": {"opening_moves": "opening_moves", "max_illegal": "max_illegal",
             "illegal_penalty": "illegal_penalty", "numbered": "numbered"},
    "policy": {"vocab_size": "vocab_size", "lora": "lora"},
    "sft": {"demos": "demos", "demo_opponent": "demo_opponent",
            "expert_p_random": "expert_p_random", "epochs": "sft_epochs",
            "batch_size": "sft_batch_size", "lr": "sft_lr", "warmup_demos": "warmup_demos",
            "warmup_epochs": "warmup_epochs"},
    "rl": {"updates": "updates", "tasks_per_update": "tasks_per_update",
           "group_size": "group_size", "estimator": "estimator",
           "estimator_options": "estimator_options", "lr": "rl_lr",
           "kl_coef": "kl_coef", "entropy_coef": "entropy_coef", "epochs": "rl_epochs"},
    "eval": {"validation_opponent": "validation_opponent",
             "holdout_opponent": "holdout_opponent", "extra_holdout": "extra_holdout",
             "frozen_opponent": "frozen_opponent",
             "tasks": "eval_tasks",
             "trials": "eval_trials", "temperature": "temperature"},
}


ROLLOUT = RolloutConfig(max_turns=8, max_action_tokens=8, max_episode_tokens=64,
                        max_context=512, temperature=1.0)


def _rollout(cfg: SelfPlayConfig) -> RolloutConfig:
    return RolloutConfig(max_turns=ROLLOUT.max_turns, max_action_tokens=ROLLOUT.max_action_tokens,
                         max_episode_tokens=ROLLOUT.max_episode_tokens,
                         max_context=ROLLOUT.max_context, temperature=cfg.temperature)


def games(cfg: SelfPlayConfig, split: str, n: int, opponent: dict[str, Any]) -> list[Task]:
    return tictactoe_tasks(split, n, seed=cfg.seed, role="both",
                           opening_moves=cfg.opening_moves, numbered=cfg.numbered, **opponent)


def single_env(cfg: SelfPlayConfig) -> TicTacToeEnv:
    return TicTacToeEnv(max_illegal=cfg.max_illegal, numbered=cfg.numbered)


def build_sft_policy(cfg: SelfPlayConfig, root: Path) -> tuple[torch.nn.Module, Any]:
    """Stage 1 (module docstring): the SFT policy and its tokenizer."""
    tasks = games(cfg, "train", cfg.demos, cfg.demo_opponent)
    rng = random.Random(cfg.seed)
    texts = [SYSTEM_PROMPT] * 10 + [t.prompt for t in tasks]
    for t in tasks[:200]:  # the moves and the answers the env writes
        env = single_env(cfg)
        env.reset(t)
        for move in tictactoe_expert(t, rng, p_random=0.3):
            texts.append(move)
            obs, *_ = env.step(move)
            texts.append(obs)
    model, tok = build_default_policy(texts, root / "v0", size="tiny",
                                      vocab_size=cfg.vocab_size, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    if cfg.warmup_demos:  # module docstring: the legal-move warm-up
        warm = asyncio.run(demonstrations(
            games(cfg, "train", cfg.warmup_demos, cfg.demo_opponent), tok,
            lambda: single_env(cfg), expert=tictactoe_expert, expert_options={"p_random": 1.0},
            seed=cfg.seed + 1, config=_rollout(cfg), episode_prefix="warmup"))
        train_sft(model, warm, epochs=cfg.warmup_epochs, batch_size=cfg.sft_batch_size,
                  lr=cfg.sft_lr, pad_id=tok.pad_token_id, seed=cfg.seed + 1)
    demos = asyncio.run(demonstrations(
        tasks, tok, lambda: single_env(cfg), expert=tictactoe_expert,
        expert_options={"p_random": cfg.expert_p_random}, seed=cfg.seed, config=_rollout(cfg)))
    train_sft(model, demos, epochs=cfg.sft_epochs, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr,
              pad_id=tok.pad_token_id, seed=cfg.seed)
    return model.eval(), tok


def evaluate_roles(policies: dict[str, torch.nn.Module], tok: Any, tasks: Sequence[Task],
                   cfg: SelfPlayConfig, split: str, tag: str) -> EvalResult:
    """Each task played by its role's policy against the task's scripted opponent; seeds are
    fixed by (task index, trial), so two evaluations pair."""
    trajs, tag = [], tag.replace("/", "-")
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "ledger.sqlite")
        try:
            for role in ROLES:
                specs = [EpisodeSpec(f"eval-{tag}-{i:04d}-{k}", t, episode_seed(cfg.seed, i, k),
                                     f"eval-{tag}:{t.task_id}")
                         for i, t in enumerate(tasks) if t.metadata["role"] == role
                         for k in range(cfg.eval_trials)]
                engine = LocalEngine(policies[role], tok, version=0, seed=cfg.seed)
                got, _ = asyncio.run(collect(
                    engine, tok, lambda: single_env(cfg), specs,
                    config=_rollout(cfg), ledger=ledger, run_id=f"eval-{tag}"))
                trajs += got
        finally:
            ledger.close()
    # "holdout/minimax" (an `extra_holdout` report) is a holdout evaluation
    return summarize(trajs, list(tasks), cfg.eval_trials, split=split.partition("/")[0])


class MatchOutcome:
    """Success of a match record: the referee (`TicTacToeGame`) ended the game with this
    record's role winning. tictactoe-v0's own verifier replays a scripted opponent from the
    task; a model opponent cannot be replayed, so a match is scored by its referee."""

    name, version = "match-outcome", "tictactoe-match-outcome-1"

    def __call__(self, traj: Any, task: Task) -> float:
        return float(traj.stop_reason is not None and traj.stop_reason.value == "won")


def evaluate_frozen(policies: dict[str, torch.nn.Module], opponent: torch.nn.Module, tok: Any,
                    tasks: Sequence[Task], cfg: SelfPlayConfig, split: str,
                    tag: str) -> EvalResult:
    """Each task's role played by its policy, the other role by the frozen `opponent` (the
    SFT checkpoint), from the task's opening; k trials per task with seeds fixed by (task
    index, trial), so the SFT policy's evaluation (against itself) and the RL policy's pair."""
    trajs = []
    for role in ROLES:
        mine = [t for t in tasks if t.metadata["role"] == role]
        me = LocalEngine(policies[role], tok, version=0, seed=cfg.seed)
        them = me if policies[role] is opponent else LocalEngine(opponent, tok, version=0,
                                                                   seed=cfg.seed + 1)
        seats = {role: Seat.frozen(me), other(role): Seat.frozen(them)}
        results = asyncio.run(run_matches(
            lambda: TicTacToeGame(cfg.max_illegal, 0.0, cfg.numbered), seats, tok, mine,
            group_size=cfg.eval_trials, config=_rollout(cfg), seed=cfg.seed,
            run_id=f"eval-{tag}"))
        trajs += [t for m in results for t in m.records if t.metadata["role"] == role]
    return summarize(trajs, list(tasks), cfg.eval_trials, MatchOutcome(), split=split)


class SelfPlay:
    """Stage 2 (module docstring): the trained model, its learner(s), one engine per role."""

    def __init__(self, sft: torch.nn.Module, tok: Any, cfg: SelfPlayConfig):
        self.cfg, self.tok = cfg, tok
        options = {k: v for k, v in cfg.lora.items() if k != "per_role"}
        self.per_role = bool(cfg.lora.get("per_role", False))
        lcfg = LearnerConfig(estimator=cfg.estimator, estimator_options=cfg.estimator_options,
                             lr=cfg.rl_lr, kl_coef=cfg.kl_coef, entropy_coef=cfg.entropy_coef,
                             epochs=cfg.rl_epochs,
                             temperature=cfg.temperature)
        model = copy.deepcopy(sft)
        if self.per_role:
            self.model = attach_roles(model, ROLES, LoraOptions.from_dict(options), cfg.seed)
            self.learner: Any = RoleLearners(self.model, ROLES, lcfg, tok.pad_token_id)
        else:
            self.model = attach(model, LoraOptions.from_dict(options), cfg.seed) if options \
                else model
            # the KL's reference: the SFT policy (with LoRA, the base under the adapter)
            ref = copy.deepcopy(sft) if cfg.kl_coef > 0 and not options else None
            self.learner = Learner(self.model, lcfg, pad_id=tok.pad_token_id, reference=ref)

    def policies(self) -> dict[str, torch.nn.Module]:
        """What each role's engine serves: its adapter merged, or the one shared policy."""
        if self.per_role:
            return {r: role_policy(self.model, r) for r in ROLES}
        plain = merged(copy.deepcopy(self.model)).eval()
        return dict.fromkeys(ROLES, plain)

    def round(self, u: int, tasks: Sequence[Task]) -> dict[str, float]:
        engines: dict[int, LocalEngine] = {}
        seats = {}
        for r, p in self.policies().items():  # one engine per distinct policy
            engines.setdefault(id(p), LocalEngine(p, self.tok, version=u,
                                                  seed=self.cfg.seed + u))
            seats[r] = Seat.policy(engines[id(p)])
        game = [Task(f"sp/{t.metadata['opening']}/{i}", "", ("won",), "train", "tictactoe-v0",
                     {"opening": t.metadata["opening"]}) for i, t in enumerate(tasks)]
        results = asyncio.run(run_matches(
            lambda: TicTacToeGame(self.cfg.max_illegal, self.cfg.illegal_penalty,
                                  self.cfg.numbered), seats,
            self.tok, game,
            group_size=self.cfg.group_size, config=_rollout(self.cfg),
            seed=self.cfg.seed * 7919 + u, run_id="selfplay", round_index=u))
        trajs = [t for m in results for t in m.trained]
        metrics = self.learner.update(trajs, version=u)
        won = [t.metadata["role"] for t in trajs
               if t.stop_reason is not None and t.stop_reason.value == "won"]
        wins = {r: won.count(r) / len(results) for r in ROLES}
        forfeits = sum(t.stop_reason is not None and t.stop_reason.value == "forfeit"
                       for t in trajs) / max(len(results), 1)
        return {"update": u, "x_win": wins["x"], "o_win": wins["o"], "forfeit": forfeits,
                **{k: float(v) for k, v in metrics.items() if k.endswith(("loss", "rows"))}}


def _figures(r: EvalResult) -> dict[str, Any]:
    return {"success": r.success, "ci95": list(r.ci95), "score_mean": r.score_mean,
            "invalid_rate": r.invalid_rate, "stop_reasons": r.stop_reasons,
            "tasks": r.tasks, "trials": r.trials}


# what the SFT stage and its evaluation depend on: a run with the same values may reuse them
SFT_KEYS = ("seed", "vocab_size", "opening_moves", "max_illegal", "numbered", "demos",
            "demo_opponent", "expert_p_random", "warmup_demos", "warmup_epochs", "sft_epochs",
            "sft_batch_size", "sft_lr", "validation_opponent", "holdout_opponent",
            "extra_holdout", "eval_tasks", "eval_trials", "temperature")


def sft_stage(cfg: SelfPlayConfig, root: Path, splits: dict[str, list[Task]],
              reuse: Path | None, log: Any) -> tuple[torch.nn.Module, Any, dict[str, EvalResult]]:
    """The SFT policy and its evaluations: built here (saved under ``sft/``), or read from
    `reuse` (an earlier run directory) when its SFT settings are these."""
    key = {k: getattr(cfg, k) for k in SFT_KEYS}
    if reuse is not None and (reuse / "sft" / "stage.json").is_file():
        saved = json.loads((reuse / "sft" / "stage.json").read_text())
        if saved["key"] == json.loads(json.dumps(key)):
            model, tok = load_policy(reuse / "sft")
            log(f"SFT policy and its evaluations reused from {reuse}")
            return model.eval(), tok, {s: _result(d) for s, d in saved["eval"].items()}
        log(f"{reuse}: other SFT settings, not reused")
    t0 = time.perf_counter()
    model, tok = build_sft_policy(cfg, root)
    log(f"SFT done in {time.perf_counter() - t0:.0f} s")
    save_policy(model, tok, root / "sft", {"policy_version": 1})
    before = {s: evaluate_roles(dict.fromkeys(ROLES, model), tok, ts, cfg, s, f"sft-{s}")
              for s, ts in splits.items()}
    (root / "sft" / "stage.json").write_text(json.dumps(
        {"key": key, "eval": {s: asdict(r) for s, r in before.items()}}))
    return model, tok, before


def _result(d: dict[str, Any]) -> EvalResult:
    return EvalResult(**{**d, "ci95": tuple(d["ci95"]), "ci95_iid": tuple(d["ci95_iid"])})


def run(cfg: SelfPlayConfig, run_dir: str | Path, log: Any = print,
        reuse_sft: str | Path | None = None) -> dict[str, Any]:
    """The three stages (module docstring); returns (and writes) the summary."""
    torch.set_num_threads(1)
    root = Path(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    splits = {"validation": games(cfg, "validation", cfg.eval_tasks, cfg.validation_opponent),
              "holdout": games(cfg, "holdout", cfg.eval_tasks, cfg.holdout_opponent),
              **{f"holdout/{name}": games(cfg, "holdout", cfg.eval_tasks, opponent)
                 for name, opponent in cfg.extra_holdout.items()}}
    sft, tok, before = sft_stage(cfg, root, splits, Path(reuse_sft) if reuse_sft else None, log)
    log("SFT: " + ", ".join(f"{s} {r.success:.3f} (invalid {r.invalid_rate:.2f}, "
                            f"{r.stop_reasons})" for s, r in before.items()))
    frozen = ("validation", "holdout") if cfg.frozen_opponent else ()
    for s in frozen:  # the SFT policy against itself: the pair of `evaluate_frozen` below
        before[f"{s}/frozen-sft"] = evaluate_frozen(dict.fromkeys(ROLES, sft), sft, tok,
                                                    splits[s], cfg, s, f"sft-{s}-frozen")
    sp = SelfPlay(sft, tok, cfg)
    train = games(cfg, "train", 4 * cfg.tasks_per_update * cfg.updates, cfg.demo_opponent)
    rng, history = random.Random(cfg.seed), []
    for u in range(1, cfg.updates + 1):
        history.append(sp.round(u, rng.sample(train, cfg.tasks_per_update)))
        log(json.dumps(history[-1]))
    policies = sp.policies()
    after = {s: evaluate_roles(policies, tok, ts, cfg, s, f"rl-{s}") for s, ts in splits.items()}
    for s in frozen:
        after[f"{s}/frozen-sft"] = evaluate_frozen(policies, sft, tok, splits[s], cfg, s,
                                                   f"rl-{s}-frozen")
    summary = {
        "config": asdict(cfg),
        "sft": {s: _figures(r) for s, r in before.items()},
        "rl": {s: _figures(r) for s, r in after.items()},
        "paired_gain": {s: compare(before[s], after[s]).to_dict() for s in after},
        "history": history, "wall_s": time.perf_counter() - t0,
    }
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    log("RL: " + ", ".join(f"{s} {r.success:.3f} {list(map(lambda x: round(x, 3), r.ci95))}"
                           for s, r in after.items()))
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--reuse-sft", default=None, metavar="RUN_DIR",
                   help="an earlier run directory whose SFT policy and evaluations to reuse "
                        "(only when its SFT settings are this config's)")
    p.add_argument("--set", nargs="*", default=[], metavar="SECTION.KEY=YAML",
                   help="override config keys, e.g. rl.updates=2 eval.tasks=10")
    a = p.parse_args(argv)
    cfg = SelfPlayConfig.load(a.config, a.set)
    run(cfg, a.run_dir, reuse_sft=a.reuse_sft)


if __name__ == "__main__":
    main()
