"""The training pipeline: demonstrations → SFT → holdout eval → GRPO → holdout eval → report.

The GRPO loop reads like the seeds' pseudo-code:

    for update u = 1..U:                       # policy version v = v_sft + u − 1
        batch  = scheduler.next_batch(v)       # rollouts of version v → ledger → queue → take
        stats  = learner.update(batch)         # credit → loss → AdamW step
        save_checkpoint(v + 1); engine.update_weights(v + 1)

Rollouts feed a `TrajectoryQueue`; the learner takes whole groups from it, and the queue
drops (and counts) every trajectory sampled by a version older than ``v − η`` (the
staleness bound η, default 0: strictly on-policy). `SyncScheduler` produces a round and
then takes it; an asynchronous scheduler would keep producing into the same queue while
the learner trains, without touching anything else.

Crash safety: every episode has a deterministic id (``r<u>-<task>-<g>``, ``demo-<i>``,
``eval-<tag>-<task>-<trial>``) and is appended to the ledger the moment it finishes.
A restarted run resumes from the newest whole checkpoint; episodes of the interrupted
round already in the ledger are reused, the missing ones are sampled by the same version
with the same seeds, so no episode is lost or stored twice. Finished phases (demos, SFT,
evaluations) are skipped on restart.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from taurl import envs
from taurl.config import dump_config
from taurl.envs.core import Env, Task
from taurl.errors import Error
from taurl.evaluate import EvalConfig, EvalResult, summarize
from taurl.ledger import Ledger
from taurl.monitor.metrics import MetricsWriter, rollout_metrics
from taurl.policy.engine import LocalEngine
from taurl.rollout import RolloutConfig, run_episode
from taurl.runs import RunDir
from taurl.synth import ExpertQuality, demonstrations
from taurl.train.checkpoint import drop_optimizer_state, load_optimizer_state, save_checkpoint
from taurl.train.copy_warmup import copy_accuracy, copy_warmup
from taurl.train.learner import Learner, LearnerConfig, sft_step
from taurl.train.sft import length_buckets, sft_lr_factor
from taurl.trajectory import Trajectory

log = logging.getLogger("taurl.pipeline")
Hook = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class PipelineConfig:
    """`taurl demo` / `taurl train`: every option of the end-to-end run."""

    seed: int = 0  # seeds the policy, task sampling, demonstrations and rollouts
    env: str = "search-v0"  # registered environment name
    env_config: dict[str, Any] = field(default_factory=lambda: {"top_k": 1, "max_doc_chars": 120})  # env keyword arguments
    system_prompt: str | None = ""  # replace the env's system prompt ("" drops it; null keeps the env's)
    families: list[str] = field(default_factory=lambda: ["city_country"])  # question families of train and holdout tasks
    split_by: str = "city"  # holdout granularity: city (unseen cities) | country (unseen countries)
    model_size: str = "tiny"  # default policy preset: tiny (0.79M params + embeddings) | small (5.9M + embeddings)
    tokenizer_texts: int = 0  # train the tokenizer on every n-th text to use about this many (0: all)
    vocab_size: int = 1024  # BPE vocabulary of the default policy's tokenizer
    max_turns: int = 3  # actions per episode
    max_action_tokens: int = 48  # sampled tokens per action
    max_episode_tokens: int = 128  # sampled tokens per episode
    max_context: int = 1024  # prompt + actions + observations
    temperature: float = 1.0  # rollout sampling temperature (training)
    concurrency: int = 64  # episodes in flight at once (the engine batches them)
    torch_threads: int = 1  # torch CPU threads (0: torch's default); a tiny policy is fastest on one (BENCHMARKS.md)
    demos: int = 12000  # expert demonstrations (one per training task)
    p_skip_search: float = 0.5  # share of demos that answer without searching (the quality knob)
    p_guess_right: float = 0.0  # chance that such an answer from memory is right
    copy_warmup_steps: int = 300  # steps of the copy warm-up before SFT, at sft_lr (taurl.train.copy_warmup; 0: none)
    copy_warmup_batch_size: int = 64  # names per copy warm-up step
    sft_epochs: int = 2  # passes over the demonstrations
    sft_batch_size: int = 32  # demonstrations per SFT step
    sft_lr: float = 3e-3  # SFT AdamW peak learning rate (linear warm-up, then linear decay to a tenth)
    sft_warmup_steps: int = 50  # SFT steps of linear learning-rate warm-up
    sft_max_seconds: float = 0.0  # stop SFT after this many seconds (0: no limit)
    updates: int = 30  # GRPO updates (each one is a new policy version)
    tasks_per_update: int = 8  # tasks per GRPO batch
    group_size: int = 8  # G: rollouts per task (group-relative advantages)
    staleness: int = 0  # η: train only on data sampled by versions >= v − η (0: on-policy)
    grpo_max_seconds: float = 0.0  # stop GRPO after this many seconds (0: no limit)
    estimator: str = "grpo"  # advantage estimator by name (taurl.credit.ESTIMATORS)
    estimator_options: dict[str, Any] = field(default_factory=dict)  # its keyword options
    objective: str = "ppo"  # policy loss by name: ppo | dual_clip_ppo | gspo | decoupled_ppo
    objective_options: dict[str, Any] = field(default_factory=dict)  # its extra keyword options
    eps_low: float = 0.2  # PPO clip range below 1
    eps_high: float = 0.28  # PPO clip range above 1 (clip-higher)
    aggregation: str = "token-mean"  # loss aggregation mode (taurl.train.objectives.AGGREGATIONS)
    lr: float = 5e-4  # GRPO AdamW learning rate
    weight_decay: float = 0.0  # GRPO AdamW weight decay
    grad_clip: float = 1.0  # max gradient norm
    kl_coef: float = 0.0  # β of the k3 KL to the frozen SFT policy (0: no reference model)
    kl_kind: str = "k3"  # KL estimator: k1 | k2 | k3
    entropy_coef: float = 0.0  # entropy bonus (entropy is always measured)
    drop_zero_variance: bool = True  # drop groups with identical rewards before the loss
    micro_batch_tokens: int = 6144  # padded tokens per micro-batch (gradient accumulation)
    epochs: int = 1  # optimizer steps per GRPO batch
    eval_tasks: int = 100  # holdout tasks per evaluation
    eval_trials: int = 3  # k trials per holdout task (pass@k)
    eval_temperature: float = 1.0  # sampling temperature of the evaluations
    eval_seed: int = 1234  # seeds holdout task choice and evaluation sampling

    def learner_config(self) -> LearnerConfig:
        keys = {f for f in LearnerConfig.__dataclass_fields__} - {"temperature"}
        return LearnerConfig(temperature=self.temperature or 1.0, **{k: getattr(self, k) for k in keys})

    def eval_config(self) -> EvalConfig:
        return EvalConfig(tasks=self.eval_tasks, trials=self.eval_trials, temperature=self.eval_temperature,
                          seed=self.eval_seed, concurrency=self.concurrency)

    def rollout_config(self, temperature: float | None = None) -> RolloutConfig:
        return RolloutConfig(max_turns=self.max_turns, max_action_tokens=self.max_action_tokens,
                             max_episode_tokens=self.max_episode_tokens, max_context=self.max_context,
                             temperature=self.temperature if temperature is None else temperature)

    def problems(self) -> list[str]:
        out = self.learner_config().problems() + self.eval_config().problems()
        if self.torch_threads < 0:
            out.append(f"torch_threads must be >= 0 (got {self.torch_threads})")
        if self.copy_warmup_steps < 0 or self.copy_warmup_batch_size < 1:
            out.append(f"copy_warmup_steps must be >= 0 and copy_warmup_batch_size >= 1 (got "
                       f"{self.copy_warmup_steps}, {self.copy_warmup_batch_size})")
        for name in ("max_turns", "max_action_tokens", "max_episode_tokens", "max_context", "concurrency",
                     "demos", "sft_epochs", "sft_batch_size", "updates", "tasks_per_update", "group_size"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.group_size < 2:
            out.append("group_size must be >= 2: group-relative advantages compare rollouts of one task")
        if self.staleness < 0:
            out.append(f"staleness must be >= 0 (got {self.staleness})")
        for name in ("p_skip_search", "p_guess_right"):
            if not 0 <= getattr(self, name) <= 1:
                out.append(f"{name} must be in [0, 1] (got {getattr(self, name)})")
        from taurl.envs.search.questions import SPLIT_BY

        if self.split_by not in SPLIT_BY:
            out.append(f"split_by must be one of {SPLIT_BY} (got {self.split_by!r})")
        if self.sft_warmup_steps < 0:
            out.append(f"sft_warmup_steps must be >= 0 (got {self.sft_warmup_steps})")
        if self.model_size not in ("tiny", "small"):
            out.append(f"model_size must be 'tiny' or 'small' (got {self.model_size!r})")
        if self.env != "search-v0":
            out.append(f"the pipeline has a task source for search-v0 only (got {self.env!r})")
        return out


# ---------------------------------------------------------------------------------------
# Episodes with deterministic ids, stored as they finish, reused after a crash


@dataclass(frozen=True)
class EpisodeSpec:
    episode_id: str
    task: Task
    seed: int
    group_id: str


async def collect(engine: Any, tokenizer: Any, make_env: Callable[[], Env], specs: Sequence[EpisodeSpec], *,
                  config: RolloutConfig, ledger: Ledger, run_id: str, concurrency: int = 64,
                  bar: tqdm | None = None, on_stored: Callable[[str, Trajectory], None] | None = None
                  ) -> tuple[list[Trajectory], dict[str, float]]:
    """The episodes of `specs`, in order: reused from the ledger, or run and appended at once.

    on_stored(event, traj) is called with "episode_finished" before an episode is appended
    and "episode_stored" after (hooks for tests and monitors; an exception aborts the round).
    """
    out: dict[str, Trajectory] = {s.episode_id: ledger.get(s.episode_id) for s in specs if s.episode_id in ledger}
    sem = asyncio.Semaphore(concurrency)
    failed: list[str] = []

    async def one(s: EpisodeSpec) -> None:
        async with sem:
            try:
                traj = await run_episode(engine, make_env(), tokenizer, s.task, seed=s.seed, config=config,
                                         group_id=s.group_id, run_id=run_id, episode_id=s.episode_id)
            except Exception as e:  # noqa: BLE001 — counted and logged, never fatal
                failed.append(f"{s.episode_id}: {type(e).__name__}: {e}")
                return
        if on_stored is not None:
            on_stored("episode_finished", traj)
        report = ledger.append_many([traj])
        if report.rejected:
            failed.extend(f"{r.episode_id}: [{r.rule}] {r.detail}" for r in report.rejected)
            return
        out[s.episode_id] = traj
        if bar is not None:
            bar.update(1)
        if on_stored is not None:
            on_stored("episode_stored", traj)

    reused = len(out)
    if bar is not None:
        bar.update(reused)
    await asyncio.gather(*(one(s) for s in specs if s.episode_id not in out))
    for why in failed:
        log.warning("episode produced no record: %s", why)
    stats = {"pipeline/reused_episodes": float(reused), "rollout/failed_episodes": float(len(failed))}
    return [out[s.episode_id] for s in specs if s.episode_id in out], stats


def _seed(*parts: Any) -> int:
    return random.Random(":".join(map(str, parts))).getrandbits(31)


# ---------------------------------------------------------------------------------------
# Queue, staleness and the (synchronous) scheduler


class TrajectoryQueue:
    """Finished trajectories waiting for the learner; enforces the staleness bound η."""

    def __init__(self) -> None:
        self._items: deque[Trajectory] = deque()
        self.stale_dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, trajs: Sequence[Trajectory]) -> None:
        self._items.extend(trajs)

    def take(self, version: int, staleness: int) -> tuple[list[Trajectory], int]:
        """Everything queued that version `version` may train on, and how many were too old.

        A trajectory is stale when any of its actions was sampled by a version < v − η.
        """
        fresh, dropped = [], 0
        while self._items:
            t = self._items.popleft()
            if min(t.policy_versions, default=-1) < version - staleness:
                dropped += 1
            else:
                fresh.append(t)
        self.stale_dropped += dropped
        return fresh, dropped


class SyncScheduler:
    """Produce one round with the current version, then take it: strictly alternating."""

    def __init__(self, produce: Callable[[int, int], list[Trajectory]], queue: TrajectoryQueue, staleness: int):
        self.produce, self.queue, self.staleness = produce, queue, staleness

    def next_batch(self, update: int, version: int) -> tuple[list[Trajectory], dict[str, float]]:
        self.queue.put(self.produce(update, version))
        batch, dropped = self.queue.take(version, self.staleness)
        return batch, {"pipeline/stale_dropped": float(dropped), "pipeline/stale_dropped_total": float(self.queue.stale_dropped),
                       "pipeline/staleness_bound": float(self.staleness)}


# ---------------------------------------------------------------------------------------
# The run


class Pipeline:
    """One run directory, its phases, and their state (see the module docstring)."""

    def __init__(self, cfg: PipelineConfig, run_dir: str, *, progress: bool = True, hook: Hook | None = None):
        if problems := cfg.problems():
            from taurl.errors import ConfigError

            raise ConfigError(problems)
        self.cfg, self.progress, self.hook = cfg, progress, hook or (lambda name, info: None)
        self.run = RunDir.create(run_dir)
        self.run_id = self.run.root.resolve().name
        self.state_path = self.run.root / "state.json"
        self.state: dict[str, Any] = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        self.metrics = MetricsWriter(self.run.metrics)
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)

    # -- helpers -----------------------------------------------------------------------
    def _save_state(self, **changes: Any) -> None:
        self.state.update(changes)
        self.state_path.write_text(json.dumps(self.state, indent=2, sort_keys=True))

    def make_env(self) -> Env:
        return make_env(self.cfg)

    def _bar(self, total: int, desc: str, unit: str = "ep") -> tqdm:
        return tqdm(total=total, desc=desc, unit=unit, disable=not self.progress, leave=False)

    def _phase(self, name: str, seconds: float) -> None:
        timings = dict(self.state.get("timings", {}))
        timings[name] = timings.get(name, 0.0) + seconds
        self._save_state(timings=timings)

    # -- phases --------------------------------------------------------------------------
    def run_all(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.run.config.write_text(dump_config(self.cfg))
        with Ledger(self.run.ledger) as ledger:
            tok = self.build_policy()
            if not self.sft_done():  # a run resumed after SFT needs no demonstrations
                self.sft(self.demonstrations(ledger, tok))
            sft_eval = self.evaluate(ledger, "sft", self.state["sft_version"])
            self.grpo(ledger)
            final_eval = self.evaluate(ledger, "final", self.run.versions()[-1])
        self._phase("total", time.perf_counter() - t0)
        summary = self.write_summary(sft_eval, final_eval)
        from taurl.monitor.report import write_report

        write_report(self.run, summary, self.metrics.read())
        return summary

    def build_policy(self):
        from taurl.commands import default_policy_texts
        from taurl.policy.model import build_default_policy
        from taurl.policy.tokenizer import load_tokenizer

        if not (self.run.checkpoint(0) / "config.json").exists():
            t0 = time.perf_counter()
            log.info("building tokenizer and %s policy v0", self.cfg.model_size)
            texts = default_policy_texts(self.cfg.env, split_by=self.cfg.split_by)
            if self.cfg.tokenizer_texts:
                texts = texts[::max(1, len(texts) // self.cfg.tokenizer_texts)]
            build_default_policy(texts, self.run.checkpoint(0), size=self.cfg.model_size,
                                 vocab_size=self.cfg.vocab_size, seed=self.cfg.seed)
            self._phase("setup", time.perf_counter() - t0)
        return load_tokenizer(self.run.checkpoint(0))

    def train_tasks(self, part: str) -> list[Task]:
        """The demonstrations' tasks ("demos") or GRPO's ("grpo"): disjoint slices of one
        shuffled list of training tasks, so RL is never rewarded for recalling a demo."""
        from taurl.envs.search import generate_tasks

        cfg = self.cfg
        n_grpo = cfg.updates * cfg.tasks_per_update
        tasks = generate_tasks("train", n=cfg.demos + n_grpo, seed=_seed(cfg.seed, "train"), families=cfg.families,
                               split_by=cfg.split_by)
        if len(tasks) < cfg.demos + n_grpo:
            raise Error(f"the families {cfg.families} have {len(tasks)} training tasks; demos + updates x "
                        f"tasks_per_update needs {cfg.demos + n_grpo}: lower them or add families")
        return tasks[:cfg.demos] if part == "demos" else tasks[cfg.demos:]

    def demonstrations(self, ledger: Ledger, tok: Any) -> list[Trajectory]:
        cfg = self.cfg
        t0 = time.perf_counter()
        tasks = self.train_tasks("demos")
        stored = [ledger.get(f"demo-{i}") for i in range(len(tasks)) if f"demo-{i}" in ledger]
        if len(stored) == len(tasks):
            return stored
        quality = ExpertQuality(p_skip_search=cfg.p_skip_search, p_guess_right=cfg.p_guess_right)
        trajs = asyncio.run(demonstrations(tasks, tok, self.make_env, quality=quality, seed=cfg.seed,
                                           run_id=self.run_id, config=self.rollout_cfg()))
        have = {t.episode_id for t in stored}
        ledger.append_many([t for t in trajs if t.episode_id not in have])
        m = rollout_metrics(trajs, time.perf_counter() - t0)
        self.metrics.write(0, {"phase": "demos", **{k.replace("rollout/", "demos/"): v for k, v in m.items()}})
        self._phase("demos", time.perf_counter() - t0)
        return trajs

    def rollout_cfg(self, temperature: float | None = None) -> RolloutConfig:
        return self.cfg.rollout_config(temperature)

    def sft_done(self) -> bool:
        return "sft_version" in self.state and self.run.checkpoint(self.state["sft_version"]).exists()

    def sft(self, demos: list[Trajectory]) -> None:
        from taurl.policy.model import load_policy

        if self.sft_done():
            return
        cfg = self.cfg
        model, tok = load_policy(self.run.checkpoint(0))
        if cfg.copy_warmup_steps:
            self.copy_warmup(model, tok)
        t0 = time.perf_counter()
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr)
        rng = random.Random(cfg.seed)
        batches = [b for _ in range(cfg.sft_epochs) for b in length_buckets(demos, cfg.sft_batch_size, rng)]
        sched = torch.optim.lr_scheduler.LambdaLR(opt, partial(sft_lr_factor, warmup=cfg.sft_warmup_steps,
                                                               total=len(batches)))
        bar = self._bar(len(batches), "sft", "step")
        steps = 0
        for steps, batch in enumerate(batches, 1):  # noqa: B007 — `steps` is reported after the loop
            m = sft_step(model, opt, batch, pad_id=tok.pad_token_id, grad_clip=cfg.grad_clip,
                         micro_batch_tokens=cfg.micro_batch_tokens)
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{m['sft/loss']:.3f}")
            self.metrics.write(steps, {"phase": "sft", **m, "sft/lr": sched.get_last_lr()[0],
                                       "sft/elapsed_s": time.perf_counter() - t0})
            if cfg.sft_max_seconds and time.perf_counter() - t0 > cfg.sft_max_seconds:
                log.info("SFT stopped by its time budget after %d of %d steps", steps, len(batches))
                break
        bar.close()
        version = 1
        save_checkpoint(self.run, version, model, tok, None, phase="sft", sft_steps=steps)
        self._phase("sft", time.perf_counter() - t0)
        self._save_state(sft_version=version, sft_steps=steps, sft_planned_steps=len(batches))

    def copy_warmup(self, model: torch.nn.Module, tok: Any) -> None:
        """The copy warm-up (taurl.train.copy_warmup) on the demonstration tasks' subjects and
        answers; copy accuracy is measured on names of GRPO tasks, which it never saw."""
        cfg = self.cfg
        t0 = time.perf_counter()
        demo_tasks = self.train_tasks("demos")
        names = list(dict.fromkeys([t.metadata["subject"] for t in demo_tasks] + [t.answers[0] for t in demo_tasks]))
        seen = set(names)
        unseen = [n for n in dict.fromkeys(t.metadata["subject"] for t in self.train_tasks("grpo")) if n not in seen]
        bar = self._bar(cfg.copy_warmup_steps, "copy warm-up", "step")

        def on_step(step: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
            if step % 25 == 0 or step == cfg.copy_warmup_steps:
                self.metrics.write(step, {"phase": "copy_warmup", "copy/loss": loss,
                                          "copy/elapsed_s": time.perf_counter() - t0})

        copy_warmup(model, tok, names, steps=cfg.copy_warmup_steps, batch_size=cfg.copy_warmup_batch_size,
                    lr=cfg.sft_lr, grad_clip=cfg.grad_clip, seed=cfg.seed, on_step=on_step)
        bar.close()
        exact = copy_accuracy(model, unseen[:256], tok)
        self.metrics.write(cfg.copy_warmup_steps, {"phase": "copy_warmup", "copy/exact_unseen": exact,
                                                   "copy/unseen_names": len(unseen[:256])})
        log.info("copy warm-up: %d steps, exact copy of unseen names %.2f", cfg.copy_warmup_steps, exact)
        self._phase("copy_warmup", time.perf_counter() - t0)

    def evaluate(self, ledger: Ledger, tag: str, version: int) -> EvalResult:
        """Holdout evaluation of checkpoint `version` (stored as ``evals/<tag>.json``)."""
        out = self.run.root / "evals" / f"{tag}.json"
        if out.exists():
            return _eval_from_dict(json.loads(out.read_text()))
        t0 = time.perf_counter()
        result = evaluate_checkpoint(self.run.checkpoint(version), self.cfg, ledger=ledger, run_id=self.run_id,
                                     tag=tag, progress=self.progress, env_factory=self.make_env)
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(result.to_dict(), indent=2))
        self.metrics.write(version, {"phase": f"eval_{tag}", **result.metrics("eval")})
        self._phase(f"eval_{tag}", time.perf_counter() - t0)
        lo, hi = result.ci95
        print(f"holdout {tag} (v{version}): success {result.success:.3f} [{lo:.3f}, {hi:.3f}] over "
              f"{result.episodes} episodes, pass@{result.trials} {result.pass_at_k:.3f}, "
              f"search rate {result.search_rate:.3f}", flush=True)
        return result

    def grpo(self, ledger: Ledger) -> None:
        from taurl.policy.model import load_policy

        cfg = self.cfg
        v_sft = self.state["sft_version"]
        version = self.run.versions()[-1]
        first = version - v_sft + 1
        if first > cfg.updates:
            return
        model, tok = load_policy(self.run.checkpoint(version))
        reference = load_policy(self.run.checkpoint(v_sft))[0] if cfg.kl_coef > 0 else None
        learner = Learner(model, cfg.learner_config(), pad_id=tok.pad_token_id, reference=reference)
        if load_optimizer_state(self.run.checkpoint(version), learner.optimizer):
            log.info("resumed GRPO at version %d (update %d) with its optimizer state", version, first)
        # the engine serves its own copy of the weights, as a separate inference server would
        engine = LocalEngine(copy.deepcopy(model), tok, version=version, max_batch_size=cfg.concurrency,
                             seed=cfg.seed)
        pool = self.train_tasks("grpo")
        rcfg = self.rollout_cfg()

        def produce(update: int, v: int) -> list[Trajectory]:
            tasks = pool[(update - 1) * cfg.tasks_per_update: update * cfg.tasks_per_update]
            specs = [EpisodeSpec(f"r{update:04d}-{i:03d}-{g:02d}", t, _seed(cfg.seed, "grpo", update, i, g),
                                 f"r{update:04d}:{t.task_id}")
                     for i, t in enumerate(tasks) for g in range(cfg.group_size)]
            trajs, stats = asyncio.run(collect(engine, tok, self.make_env, specs, config=rcfg, ledger=ledger,
                                               run_id=self.run_id, concurrency=cfg.concurrency,
                                               on_stored=lambda event, t: self.hook(event,
                                                                                    {"episode_id": t.episode_id})))
            produce.stats = stats  # type: ignore[attr-defined]
            return trajs

        scheduler = SyncScheduler(produce, TrajectoryQueue(), cfg.staleness)
        bar = self._bar(cfg.updates, "grpo", "update")
        bar.update(first - 1)
        t_start = time.perf_counter()
        for update in range(first, cfg.updates + 1):
            t0 = time.perf_counter()
            batch, qstats = scheduler.next_batch(update, version)
            t_roll = time.perf_counter() - t0
            self.hook("rollouts_stored", {"update": update, "version": version, "episodes": len(batch)})
            lstats = learner.update(batch)
            t1 = time.perf_counter()
            version += 1
            save_checkpoint(self.run, version, model, tok, learner.optimizer, phase="grpo", update=update)
            drop_optimizer_state(self.run.checkpoint(version - 1))  # a restart needs only the newest
            asyncio.run(engine.update_weights({k: v.detach().clone() for k, v in model.state_dict().items()},
                                              version))
            t_save = time.perf_counter() - t1
            row = {"phase": "grpo", "update": update, "policy/version": version,
                   **rollout_metrics(batch, t_roll), **qstats, **getattr(produce, "stats", {}), **lstats,
                   "time/rollout_s": t_roll, "time/learn_s": lstats.get("learn/learn_s", 0.0),
                   "time/checkpoint_s": t_save, "time/update_s": time.perf_counter() - t0}
            row["rollout/groups_same_reward"] = _same_reward_share(batch)
            self.metrics.write(update, row)
            bar.update(1)
            tqdm.write(console_line(row, cfg.updates)) if self.progress else log.info(console_line(row, cfg.updates))
            self.hook("update_done", {"update": update, "version": version})
            self._phase("grpo", time.perf_counter() - t0)
            if cfg.grpo_max_seconds and time.perf_counter() - t_start > cfg.grpo_max_seconds and update < cfg.updates:
                log.info("GRPO stopped by its time budget after update %d of %d", update, cfg.updates)
                self._save_state(grpo_stopped_early=update)
                break
        bar.close()

    def write_summary(self, sft: EvalResult, final: EvalResult) -> dict[str, Any]:
        v_sft = self.state["sft_version"]
        versions = self.run.versions()
        gain = final.success - sft.success
        summary = {
            "run": self.run_id,
            "holdout": {"sft": sft.to_dict(), "final": final.to_dict(), "gain": gain,
                        "intervals_overlap": not (final.ci95[0] > sft.ci95[1] or sft.ci95[0] > final.ci95[1])},
            "train": {"updates": versions[-1] - v_sft, "policy_version": versions[-1], "sft_version": v_sft,
                      "sft_steps": self.state.get("sft_steps", 0), "demos": self.cfg.demos,
                      "estimator": self.cfg.estimator, "objective": self.cfg.objective,
                      "group_size": self.cfg.group_size, "tasks_per_update": self.cfg.tasks_per_update,
                      "stopped_early": self.state.get("grpo_stopped_early")},
            "wall_seconds": self.state.get("timings", {}).get("total", 0.0),
            "timings": self.state.get("timings", {}),
            "config": asdict(self.cfg),
        }
        self.run.summary.write_text(json.dumps(summary, indent=2))
        return summary


def make_env(cfg: PipelineConfig) -> Env:
    """The run's environment. A replaced system prompt is set on the instance: the search
    env's Search-R1 instructions are written for large models, while a tiny policy learns
    the format from the demonstrations, and on short episodes the prompt is most of the
    tokens every SFT and GRPO step pays for."""
    env = envs.make(cfg.env, max_turns=cfg.max_turns, **cfg.env_config)
    if cfg.system_prompt is not None:
        env.system_prompt = cfg.system_prompt
    return env


def _same_reward_share(trajs: Sequence[Trajectory]) -> float:
    groups: dict[str, set[float]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, set()).add(t.reward)
    return sum(len(r) == 1 for r in groups.values()) / max(len(groups), 1)


def console_line(row: dict[str, Any], total: int) -> str:
    """The live line printed after each update."""
    g = row.get
    return (f"update {g('update')}/{total} v{g('policy/version')}  reward {g('rollout/reward_mean', 0):.2f}"
            f"±{g('rollout/reward_std', 0):.2f}  success {g('rollout/success', 0):.2f}  search "
            f"{g('rollout/search_rate', 0):.2f}  same-groups {g('rollout/groups_same_reward', 0):.2f}  "
            f"invalid {g('rollout/invalid_rate', 0):.2f}  trunc {g('rollout/truncation_rate', 0):.2f}  "
            f"clip {g('learn/clip_frac', 0):.3f}  kl {g('learn/approx_kl', 0):.4f}  ent "
            f"{g('learn/entropy', 0):.2f}  |g| {g('learn/grad_norm', 0):.2f}  tok/s {g('learn/tokens_per_s', 0):.0f}  "
            f"roll {g('time/rollout_s', 0):.1f}s learn {g('time/learn_s', 0):.1f}s")


def _eval_from_dict(d: dict[str, Any]) -> EvalResult:
    d = dict(d)
    d["ci95"] = tuple(d["ci95"])
    return EvalResult(**d)


def holdout_tasks(cfg: PipelineConfig) -> list[Task]:
    from taurl.envs.search import generate_tasks

    ecfg = cfg.eval_config()
    tasks = generate_tasks("holdout", n=ecfg.tasks, seed=ecfg.seed, families=cfg.families, split_by=cfg.split_by)
    if not tasks:
        raise Error(f"no holdout tasks for families {cfg.families} with split_by={cfg.split_by!r}; split_by 'city' "
                    "holds out cities only (questions about a country are all training tasks): use a city family "
                    "or split_by: country")
    return tasks


def evaluate_checkpoint(path: Any, cfg: PipelineConfig, *, ledger: Ledger | None = None, run_id: str = "eval",
                        tag: str = "eval", progress: bool = True,
                        env_factory: Callable[[], Env] | None = None) -> EvalResult:
    """Evaluate the policy at `path` on the holdout split (k trials per task, own verifier)."""
    from taurl.commands import policy_version
    from taurl.policy.model import load_policy

    ecfg = cfg.eval_config()
    model, tok = load_policy(path)
    version = policy_version(path)
    engine = LocalEngine(model, tok, version=version, max_batch_size=ecfg.concurrency, seed=ecfg.seed)
    tasks = holdout_tasks(cfg)
    specs = [EpisodeSpec(f"eval-{tag}-{i:04d}-{k}", t, _seed(ecfg.seed, i, k), f"eval-{tag}:{t.task_id}")
             for i, t in enumerate(tasks) for k in range(ecfg.trials)]
    factory = env_factory or (lambda: make_env(cfg))
    t0 = time.perf_counter()
    bar = tqdm(total=len(specs), desc=f"eval {tag}", unit="ep", disable=not progress, leave=False)
    with tempfile.TemporaryDirectory() as tmp:  # a checkpoint outside a run keeps its episodes in a scratch ledger
        own = Ledger(Path(tmp) / "ledger.sqlite") if ledger is None else None
        try:
            trajs, _ = asyncio.run(collect(engine, tok, factory, specs, config=cfg.rollout_config(ecfg.temperature),
                                           ledger=ledger or own, run_id=run_id, concurrency=ecfg.concurrency, bar=bar))
        finally:
            bar.close()
            if own is not None:
                own.close()
    return summarize(trajs, tasks, ecfg.trials, wall_s=time.perf_counter() - t0)


def run_pipeline(cfg: PipelineConfig, run_dir: str, *, progress: bool = True, hook: Hook | None = None) -> dict[str, Any]:
    """Run (or resume) the whole pipeline in `run_dir`; returns the summary."""
    return Pipeline(cfg, run_dir, progress=progress, hook=hook).run_all()
