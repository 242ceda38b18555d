"""The training recipe (`taurl train`, `taurl demo`): any registered env, any local HF causal LM.

    tasks   = plan_tasks(env)                    # train (demos | RL pool) / validation / holdout
    policy  = cfg.model | the env's default policy (tokenizer on training text, warm-up hook)
    sft     = expert demonstrations through the real loop | a trajectory file | none
    evaluate(validation, holdout) of the SFT policy
    for update u = 1..U:                         # policy version v = v_sft + u − 1
        batch = collect(engine, env, rl_tasks[u])          # rollouts of version v, stored at
                                                           # once (backend: local | ray)
        stats = rl_step(learner, batch, v)                 # credit (estimator, filter, critic
                                                           # fit), then rows → loss → AdamW step
        checkpoint(v + 1); engine.load_weights(v + 1)      # serve (and verify) the new version
    evaluate(validation, holdout) of the final policy → summary.json, report.html
    promote(final, baseline=SFT) from those evaluations → promotions.jsonl, summary["promotion"]

Nothing here names an environment: the env's task source, expert, verifier and policy
hooks come from its registration (`taurl.envs.spec.EnvSpec`). Validation is for choices
(settings are compared on it); holdout is only reported.

Crash safety: every episode has a deterministic id and seed (`taurl.rollout.episodes`) and is
appended to the ledger as it finishes; checkpoints, state.json and evals/*.json are
written whole or not at all (`taurl.data.atomic`). A restarted run removes the leftovers of
interrupted writes, resumes from the newest checkpoint (weights, optimizer, RNG states),
reuses the stored episodes of the interrupted round and samples the missing ones with the
same version and seeds; finished phases (policy, demonstrations, SFT, evaluations) are
skipped. Named kill points (`taurl.chaos`) let the chaos test SIGKILL a run anywhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from typing import Any

import torch

from taurl import chaos, envs
from taurl.data.atomic import atomic_write_text
from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.envs.tasks import plan_tasks
from taurl.errors import Error
from taurl.monitor.alarms import Watch, low_precision, staleness_max
from taurl.monitor.memory import PeakRSS
from taurl.monitor.metrics import rollout_metrics, same_reward_share
from taurl.monitor.sinks import metrics_writer
from taurl.policy.model import build_default_policy, load_policy
from taurl.recipe.collectors import rollout_collector
from taurl.recipe.config import TrainConfig
from taurl.recipe.evaluation import evaluate_both, write_summary
from taurl.recipe.mixing import BatchMix
from taurl.recipe.record import judge_update, record_update, recover_row
from taurl.recipe.resume import check_resume, run_identity
from taurl.recipe.rl_step import rl_step
from taurl.recipe.sections import flat_options
from taurl.recipe.stages import make_learner, run_own_stage, sft_steps
from taurl.recipe.state import Hook, Run, check_run_env, make_env
from taurl.recipe.validate import check_config, dump_config
from taurl.rollout.episodes import Collector, EpisodeSpec
from taurl.rollout.seeds import episode_seed
from taurl.train import lora
from taurl.train.checkpoint import (
    drop_optimizer_state,
    load_optimizer_state,
    load_trainer_state,
    prune_checkpoints,
    remove_served,
    save_checkpoint,
    save_served,
    seed_rng,
)
from taurl.train.default_policy import default_policy_texts
from taurl.train.learner import Learner
from taurl.train.precision import master_dtype
from taurl.train.sft import read_sft_file

log = logging.getLogger("taurl.recipe.loop")


def train(cfg: TrainConfig, run_dir: str, *, progress: bool = True,
          hook: Hook | None = None) -> dict[str, Any]:
    """Run (or resume) the recipe in `run_dir`; returns summary.json's content."""
    # types, values and imports: every problem at once, before any file is written
    cfg = check_config(cfg)
    spec = envs.spec(cfg.env)
    plan = plan_tasks(cfg.env, task_file=cfg.tasks, task_options=cfg.task_options,
                      env_config=cfg.env_config,
                      n_demos=cfg.demos if cfg.sft.data == "expert" else 0,
                      n_rl=cfg.updates * cfg.tasks_per_update,
                      n_eval=cfg.eval_tasks, seed=episode_seed(cfg.seed, "train"),
                      eval_seed=cfg.eval_seed)
    # the env keeps the protocol, or the run is refused before any file is written
    env_check = check_run_env(cfg, (plan.rl or plan.demos or plan.validation)[0],
                              episode_seed(cfg.seed, "env-check"))
    # a resume is this run, or refused (taurl.recipe.resume), also before any file is written
    identity = run_identity(cfg, make_env(cfg))
    check_resume(run_dir, identity)
    run = RunDir.create(run_dir)
    run.clean()  # what an interrupted write left half-done is never trusted
    state_path = run.root / "state.json"
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    t0 = time.perf_counter()
    atomic_write_text(run.config, dump_config(cfg))
    with Ledger(run.ledger) as ledger, metrics_writer(run.metrics, cfg.trackers, run.root,
                                                      flat_options(cfg)) as metrics:
        r = Run(cfg, spec, plan, run, ledger, metrics, progress,
                chaos.hooked(hook or (lambda n, i: None)),
                json.loads(state_path.read_text()) if state_path.exists() else {})
        r.save_state(identity=identity)  # what a later start in this directory must match
        metrics.write(0, env_check)
        if (cfg.schedule.kind == "async" and cfg.backend == "local"
                and not r.state.get("rl_stopped_early")):
            from taurl.recipe.schedule.learner_proc import LearnerProcess

            # its imports (seconds) overlap SFT and the first evaluation
            r.learner_process = LearnerProcess()
        try:
            prepare_policy(r)
            if "sft_version" not in r.state:
                sft(r, sft_data(r))
            evals = {"sft": evaluate_both(r, "sft", r.state["sft_version"])}
            if not run_own_stage(r):
                # rejection rounds, offline DPO (taurl.recipe.stages); else the RL loop
                reinforce(r)
        finally:
            if r.learner_process is not None:
                # (RL closed it; here if RL did not run or failed first)
                r.learner_process.close()
        evals["final"] = evaluate_both(r, "final", run.versions()[-1])
        r.phase_done("total", time.perf_counter() - t0)
        summary = write_summary(r, evals)
    from taurl.monitor.report import write_report

    write_report(run, summary, r.metrics.read())
    return summary


# ---------------------------------------------------------------------------------------
# Policy and SFT


def prepare_policy(r: Run) -> None:
    """checkpoints/v0: the given model, or the env's default policy (+ its warm-up hook)."""
    if (r.run.checkpoint(0) / "config.json").exists():
        return
    t0, cfg = time.perf_counter(), r.cfg
    if cfg.model:
        model, tok = load_policy(given_model(r))
    else:
        texts = default_policy_texts(r.spec, r.make_env, r.plan.demos + r.plan.rl,
                                     task_options=cfg.task_options,
                                     expert_options=cfg.expert_options, seed=cfg.seed)
        if cfg.tokenizer_texts:
            texts = texts[::max(1, len(texts) // cfg.tokenizer_texts)]
        if cfg.agent and cfg.sft.data == "expert":
            # the agent's action format (tool-call JSON) gets merges too
            from taurl.proxy.demos import agent_tokenizer_texts

            texts += agent_tokenizer_texts(cfg, r.plan.demos)
        log.info("building the default %s policy (tokenizer on %d training texts)", cfg.model_size,
                 len(texts))
        with tempfile.TemporaryDirectory() as tmp:  # v0 is written once, whole, below
            model, tok = build_default_policy(texts, tmp, size=cfg.model_size,
                                              vocab_size=cfg.vocab_size,
                                              seed=cfg.seed, chat_template=cfg.chat_template)
        if hasattr(r.spec.policy_hooks, "warmup"):
            from taurl.train.copy_warmup import copy_warmup_phase

            m = r.spec.policy_hooks.warmup(
                model, tok, r.plan.demos or r.plan.rl, seed=cfg.seed, lr=cfg.sft_lr,
                grad_clip=cfg.grad_clip,
                log=lambda step, row: r.metrics.write(step, {"phase": "warmup", **row}),
                probe_tasks=r.plan.rl, copy_phase=copy_warmup_phase, **cfg.warmup_options)
            r.metrics.write(0, {"phase": "warmup", **m})
            log.info("warm-up: %s", ", ".join(f"{k} {v:.3f}" for k, v in m.items()))
    save_checkpoint(r.run, 0, model, tok, None, phase="initial", source=cfg.model or "default",
                    **r.checkpoint_meta())
    r.phase_done("setup", time.perf_counter() - t0)


def given_model(r: Run) -> str:
    """The local directory of `model:` (a GGUF file or registry model converted once into the
    model cache), its provenance saved in state.json for the summary."""
    from taurl.policy.sources import resolve_model

    source = resolve_model(r.cfg.model)
    if ignored := r.cfg.default_policy_options_ignored():
        log.info("model %s is given: the default policy's options %s are not applied", r.cfg.model,
                 ignored)
    from taurl.policy.sources import renders_tools

    if r.make_env().observation_style != "inline" and not renders_tools(source.path):
        log.warning("the chat template of %s ignores `tools`: %s's tool schemas will not be in the "
                    "prompt; give the model a template that renders them (docs/models.md: tools)",
                    r.cfg.model, r.cfg.env)
    r.save_state(model_source=source.to_dict())
    return str(source.path)


def sft_data(r: Run) -> list:
    """The SFT trajectories: expert demonstrations (stored as ``demo-<i>``), a file, or none."""
    cfg, t0 = r.cfg, time.perf_counter()
    if cfg.sft.data in ("none", "rejection"):
        # rejection: the policy's own samples, after this (taurl.recipe.stages)
        return []
    if cfg.sft.data == "file":
        return read_sft_file(cfg.sft_data, cfg.env)
    if cfg.agent:  # the expert's replies served to the user's agent through the proxy
        from taurl.proxy.demos import agent_demonstrations

        return agent_demonstrations(r)
    from taurl.policy.tokenizer import load_tokenizer
    from taurl.rollout.synth import demonstrations

    ids = [f"demo-{i}" for i in range(len(r.plan.demos))]
    if all(i in r.ledger for i in ids):
        return [r.ledger.get(i) for i in ids]
    trajs = asyncio.run(demonstrations(r.plan.demos, load_tokenizer(r.run.checkpoint(0)),
                                       r.make_env,
                                       expert=r.spec.expert, expert_options=cfg.expert_options,
                                       seed=cfg.seed,
                                       run_id=r.run.root.name, config=cfg.rollout_config()))
    r.ledger.append_many([t for t in trajs if t.episode_id not in r.ledger])
    m = rollout_metrics(trajs, time.perf_counter() - t0)
    r.metrics.write(0, {"phase": "demos",
                        **{k.replace("rollout/", "demos/"): v for k, v in m.items()}})
    r.phase_done("demos", time.perf_counter() - t0)
    return trajs


def sft(r: Run, trajs: list) -> None:
    """checkpoints/v1: v0 fine-tuned on `trajs` (v0 itself when there is no SFT data)."""
    cfg, t0 = r.cfg, time.perf_counter()
    device, dtype = r.placement()
    model, tok = load_policy(r.run.checkpoint(0), device, dtype=dtype)
    run = None
    if trajs:
        if cfg.lora:  # SFT trains an adapter, merged into v1 below: the RL base (taurl.train.lora)
            model = lora.attach(model, lora.LoraOptions.from_dict(cfg.lora), cfg.seed)
        bar = r.bar(1, "sft", "step")

        def on_step(step: int, total: int, m: dict[str, float]) -> None:
            bar.total = total
            bar.update(1)
            bar.set_postfix(loss=f"{m['sft/loss']:.3f}")
            r.metrics.write(step, {"phase": "sft", **m})
            r.hook("sft_step", {"step": step})

        run = sft_steps(cfg)(  # in this process, or on the learner's ranks (train.strategy)
            model, trajs, epochs=cfg.sft_epochs, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr,
            warmup_steps=cfg.sft_warmup_steps, grad_clip=cfg.grad_clip, pad_id=tok.pad_token_id,
            micro_batch_tokens=cfg.micro_batch_tokens, seed=cfg.seed, max_steps=cfg.sft_max_steps,
            max_seconds=cfg.sft_max_seconds, on_step=on_step)
        bar.close()
        model = lora.merged(model)
    steps = run.steps if run else 0
    save_checkpoint(r.run, 1, model, tok, None, phase="sft", sft_steps=steps, **r.checkpoint_meta())
    r.phase_done("sft", time.perf_counter() - t0)
    r.save_state(sft_version=1, sft_steps=steps, sft_planned_steps=run.planned if run else 0,
                 sft_stopped_by=run.stopped_by if run else None, sft_examples=len(trajs))


# ---------------------------------------------------------------------------------------
# Reinforcement learning


def reinforce(r: Run) -> None:
    """RL updates from the newest checkpoint on (module docstring: the loop)."""
    cfg, v_sft = r.cfg, r.state["sft_version"]
    version = r.run.versions()[-1]
    first = version - v_sft + 1
    recover_row(r, version)
    # if a kill came first
    prune_checkpoints(r.run, cfg.keep_checkpoints, {0, v_sft, *r.run.promoted_versions()})
    if first > cfg.updates or r.state.get("rl_stopped_early"):
        return
    device, dtype = r.placement()  # the policy's; the reference, critic and step scorer follow it
    dtype = master_dtype(cfg.precision, cfg.torch_dtype)  # fp32 masters under mixed precision
    if cfg.lora:  # adapters on the SFT policy; the KL reference is that policy, adapters off
        model, tok = lora.rl_policy(r.run, version, v_sft, lora.LoraOptions.from_dict(cfg.lora),
                                    seed=cfg.seed)
        model.to(device=device, dtype=dtype)
        reference = None
    else:
        model, tok = load_policy(r.run.checkpoint(version), device, dtype=dtype)
        reference = load_policy(r.run.checkpoint(v_sft), device,
                                dtype=dtype)[0] if cfg.kl_coef > 0 else None
    # RL's, or online DPO's or distillation's (taurl.recipe.stages)
    learner = make_learner(r, model, tok, reference)
    if load_optimizer_state(r.run.checkpoint(version), learner.optimizer):
        log.info("resumed RL at version %d (update %d) with its optimizer state", version, first)
    if learner.load_state(r.run.checkpoint(version)):
        log.info("restored the learner's state (critic, step scorer) saved with version %d",
                 version)
    # the engine serves its own copy of the weights (a vLLM server, or LocalEngine in-process)
    seed = cfg.seed if cfg.rl_seed is None else cfg.rl_seed
    collector = rollout_collector(r, version, tok, seed=seed)
    # last, after every model is built (that draws from torch's generator): the RNG states
    # the saved run had, or, at the first update, states fixed by the seed alone
    if not load_trainer_state(r.run.checkpoint(version)):
        seed_rng(episode_seed(seed, "rl-rng"))
    chaos.on_optimizer_step(learner.optimizer)
    chaos.point("rl_start", f"version={version}", lambda: chaos.state_digests(learner.optimizer))
    loop = _rl_loop
    if cfg.schedule.kind == "async":
        # rollouts run ahead of the learner, staleness <= eta (taurl.recipe.schedule)
        from taurl.recipe.schedule.async_rl import async_rl_loop as loop
    try:
        loop(r, model, tok, learner, collector, version, first, seed)
    finally:
        collector.close()
        if hasattr(learner, "close"):  # a distributed learner's ranks (taurl.train.distributed)
            learner.close()


# Over 60 lines on purpose: the synchronous RL phase read top to bottom, one update per
# iteration: collect, credit, update, checkpoint, serve, record; the loop's steps are what a
# reader follows.
def _rl_loop(r: Run, model: Any, tok: Any, learner: Learner, collector: Collector, version: int,
             first: int, seed: int) -> None:
    cfg, v_sft = r.cfg, r.state["sft_version"]
    # optional curriculum (which tasks) and replay (what else is trained on); both off: no-ops
    mix = BatchMix.start(cfg, r.plan.rl, seed, r.ledger, r.run.root.name, first, v_sft)
    bar = r.bar(cfg.updates, "rl", "update")
    bar.update(first - 1)
    t_start = time.perf_counter()
    watch = Watch(cfg.alarms, r.metrics.read(),  # health alarms (taurl.monitor.alarms)
                  low=low_precision(cfg.precision, cfg.torch_dtype))
    # a LoRA checkpoint names its base (the SFT checkpoint) and that base's digest
    adapter = ({"lora": lora.checkpoint_meta(r.run, v_sft, lora.LoraOptions.from_dict(cfg.lora))}
               if cfg.lora else {})
    # rows of updates after the newest checkpoint (checkpoint_every > 1) were written before a
    # restart; those updates are redone from the ledger's episodes, their rows not written twice
    recorded = {x.get("update") for x in r.metrics.read() if x.get("phase") == "rl"}
    remove_served(r.run)
    peak = PeakRSS()  # per phase: rollout, learn, checkpoint (taurl.monitor.memory)
    for update in range(first, cfg.updates + 1):
        t0 = time.perf_counter()
        peak.reset(release=True)  # each phase's peak is its own (allocator's free memory returned)
        tasks, mstats = mix.tasks(update, r.plan.rl[(update - 1) * cfg.tasks_per_update:
                                                    update * cfg.tasks_per_update])
        specs = [EpisodeSpec(f"r{update:04d}-{i:03d}-{g:02d}", t,
                             episode_seed(seed, "rl", update, i, g), f"r{update:04d}:{t.task_id}")
                 for i, t in enumerate(tasks) for g in range(cfg.group_size)]
        batch, cstats = collector.collect(specs, ledger=r.ledger,
                                          on_stored=lambda event, t: r.hook(
                                              event, {"episode_id": t.episode_id}))
        if stale := [t.episode_id for t in batch if set(t.policy_versions) - {version}]:
            raise Error(f"{len(stale)} episode(s) of update {update} were not sampled by version "
                        f"{version} (e.g. {stale[0]}): the ledger holds episodes of another run; "
                        "use a fresh --run-dir")
        t_roll = time.perf_counter() - t0
        mem = {"mem/rollout_peak_rss_mb": peak.read_mb()}
        if hasattr(collector, "release_caches"):  # the engine's copies the update rebuilds
            collector.release_caches()
        peak.reset(release=True)
        r.hook("rollouts_stored", {"update": update, "version": version, "episodes": len(batch)})
        train_batch, rstats = mix.batch(batch, update, version)
        lstats = rl_step(learner, train_batch, version)  # credit, then update (rl_step.py)
        mix.observe(batch)
        t1 = time.perf_counter()
        mem["mem/learn_peak_rss_mb"] = peak.read_mb()
        peak.reset(release=True)
        version += 1
        row = {"phase": "rl", "update": update, "policy/version": version,
               **rollout_metrics(batch, t_roll), **cstats, **lstats, **mstats, **rstats,
               "rollout/groups_same_reward": same_reward_share(batch),
               "time/rollout_s": t_roll, "time/learn_s": lstats.get("learn/learn_s", 0.0),
               "rollout/staleness_max": staleness_max(batch, version - 1), **mem}
        stop = judge_update(r, watch, row, update, t_start)
        # a checkpoint every checkpoint_every updates, at the last one and where RL stops
        if update % cfg.checkpoint_every == 0 or update == cfg.updates or stop is not None:
            # the row goes into the checkpoint too: a kill between the two loses no row
            # (recover_row)
            save_checkpoint(r.run, version, model, tok, learner.optimizer, phase="rl",
                            update=update,
                            write_extra=learner.save_state, metrics_row=row, **adapter,
                            **r.checkpoint_meta())
            for v in r.run.versions()[:-1]:  # a restart needs only the newest optimizer state
                drop_optimizer_state(r.run.checkpoint(v))
            remove_served(r.run)
            r.hook("checkpoint_saved", {"version": version})
            prune_checkpoints(r.run, cfg.keep_checkpoints, {0, v_sft, *r.run.promoted_versions()})
            # served (and verified) by every engine
            collector.load_weights(r.run.checkpoint(version), version)
        else:  # the weights alone, outside the checkpoints, for the engines to load
            collector.load_weights(save_served(r.run, version, model, tok, **adapter), version)
        row = {**row, "time/checkpoint_s": time.perf_counter() - t1,
               "time/update_s": time.perf_counter() - t0,
               "mem/checkpoint_peak_rss_mb": peak.read_mb()}
        record_update(r, bar, row, update, version, t0, write=update not in recorded)
        if stop is not None:
            r.save_state(**stop)
            break
    bar.close()
