"""The recipe's training stage after the SFT checkpoint: RL, or one of three other contracts.

    stage      chosen by                 what each step trains on
    rl         (default)                 advantages of the policy's own samples
                                         (`taurl.train.learner`)
    rejection  sft: rejection            the policy's verified, clean samples, SFT
                                         (`taurl.rollout.rejection`)
    dpo        rl.objective: dpo         pairs of a higher- and a lower-reward episode of one task
                                         (`taurl.train.pair_learner`); online, or offline from
                                         rl.dpo.data
    distill    rl.teacher: DIR           the teacher's distribution on the student's own action
                                         tokens (`taurl.train.distill`)

Every stage is a step of the same recipe (`taurl.recipe.loop`): the config is validated at
once, the stage starts from the SFT checkpoint (``v_sft``; with ``sft: rejection`` or ``none``
that is the given model), the validation and holdout evaluations, the promotion gate and the
report follow as for RL. The budget is the same knob for all of them: ``rl.updates ×
rl.tasks_per_update × rl.group_size`` sampled episodes (rejection splits it over its rounds;
offline DPO samples none). Online DPO and distillation run inside the RL loop itself (same
collection, checkpoints, serving, resume); only their learner differs (`make_learner`).
"""

from __future__ import annotations

import logging
from typing import Any

from taurl.errors import ConfigError
from taurl.policy.model import load_policy
from taurl.recipe.typed import record_mapping

log = logging.getLogger("taurl.recipe.stages")

STAGES = ("rl", "rejection", "dpo", "distill")


def stage_name(cfg: Any) -> str:
    if cfg.sft.data == "rejection":
        return "rejection"
    if cfg.teacher:
        return "distill"
    return "dpo" if cfg.objective == "dpo" else "rl"


def stage_problems(cfg: Any) -> list[str]:
    """The stage options' problems (TrainConfig.problems gathers them with the rest)."""
    from taurl.rollout.options import RejectionOptions
    from taurl.train.stage_options import DistillOptions, DPOOptions

    out: list[str] = []
    chosen = [s for s, on in (("sft: rejection", cfg.sft.data == "rejection"),
                              ("rl.teacher", bool(cfg.teacher)),
                              ("rl.objective: dpo", cfg.objective == "dpo")) if on]
    if len(chosen) > 1:
        out.append(f"{' and '.join(chosen)} are different stages; choose one per run (chain runs "
                   "with model:)")
    if cfg.rejection != RejectionOptions() and cfg.sft.data != "rejection":
        out.append("sft.rejection options are set but sft is not 'rejection'")
    if cfg.dpo != DPOOptions() and cfg.objective != "dpo":
        out.append("rl.dpo options are set but rl.objective is not 'dpo'")
    if cfg.distill != DistillOptions() and not cfg.teacher:
        out.append("rl.distill options are set but rl.teacher is not: give the teacher's "
                   "checkpoint directory")
    if stage_name(cfg) != "rl" and cfg.schedule.kind != "sync":
        out.append(f"the {stage_name(cfg)} stage runs with schedule: sync (its learner is not the "
                   "async one)")
    if cfg.sft.data == "rejection" and cfg.backend != "local":
        out.append(f"sft: rejection samples its rounds in this process (with its own temperature); "
                   f"backend: {cfg.backend} is not supported there: drop backend (local)")
    if stage_name(cfg) != "rl" and cfg.lora:
        out.append(f"the {stage_name(cfg)} stage trains the full policy; drop policy.lora")
    if (data := cfg.dpo.data) and not _is_file(data):
        out.append(f"rl.dpo.data {data!r} is not a file; give a trajectory JSONL file (taurl "
                   "export)")
    if cfg.teacher:
        out += teacher_problems(cfg.teacher, cfg.model)
    from taurl.recipe.chain_checks import chain_problems

    return out + chain_problems(cfg, stage_name(cfg))


def _is_file(path: str) -> bool:
    from pathlib import Path

    return Path(path).is_file()


def teacher_problems(teacher: str, model: str) -> list[str]:
    """A teacher that is not a checkpoint, or (when the student is a given model) one whose
    tokenizer differs from the student's: refused before any file is written."""
    from pathlib import Path

    if not (Path(teacher) / "config.json").is_file():
        return [f"rl.teacher {teacher!r} is not a model directory (no config.json); give a "
                "checkpoint, e.g. runs/demo/checkpoints/v31"]
    if not model or not (Path(model) / "config.json").is_file():
        return []  # the student is built by the run: its tokenizer is checked when the stage starts
    from taurl.policy.tokenizer import load_tokenizer
    from taurl.train.distill import tokenizer_problem

    why = tokenizer_problem(load_tokenizer(model), load_tokenizer(teacher), f"rl.teacher {teacher}")
    return [why] if why else []


def make_learner(r: Any, model: Any, tok: Any, reference: Any) -> Any:
    """The learner of the run's stage, over `model` (the RL loop calls it once)."""
    return learner_for(r.cfg, r.run, r.state["sft_version"], model, tok, reference)


def learner_for(cfg: Any, run: Any, v_sft: int, model: Any, tok: Any, reference: Any) -> Any:
    """The learner of `cfg`'s stage over `model`, for the run directory `run` whose SFT
    checkpoint is `v_sft`: the one factory of the synchronous loop (`make_learner`) and the
    async learner process (`taurl.recipe.schedule.learner_proc`), which has no `Run`."""
    from taurl.policy.device import resolve_device, resolve_dtype
    from taurl.train.learner import Learner
    from taurl.train.prm import step_scorer

    stage = stage_name(cfg)
    common = {"lr": cfg.lr, "grad_clip": cfg.grad_clip, "pad_id": tok.pad_token_id,
              "temperature": cfg.temperature,
              "weight_decay": cfg.weight_decay, "lr_warmup_steps": cfg.lr_warmup_steps}
    device, dtype = resolve_device(cfg.device), resolve_dtype(cfg.torch_dtype)  # Run.placement
    if stage == "dpo":
        from taurl.train.pair_learner import DPOLearner

        if reference is None:  # the frozen reference: the stage's starting (SFT) policy
            reference = load_policy(run.checkpoint(v_sft), device, dtype=dtype)[0]
        return DPOLearner(model, reference, cfg.dpo,
                          micro_batch_tokens=cfg.micro_batch_tokens, **common)
    if stage == "distill":
        from taurl.train.distill import DistillLearner, tokenizer_problem

        teacher, t_tok = load_policy(cfg.teacher, device, dtype=dtype)
        if why := tokenizer_problem(tok, t_tok, f"rl.teacher {cfg.teacher}"):
            raise ConfigError(why)
        return DistillLearner(model, teacher, cfg.distill,
                              micro_batch_tokens=cfg.micro_batch_tokens, estimator=cfg.estimator,
                              eps_low=cfg.eps_low, eps_high=cfg.eps_high, **common)
    if cfg.train.strategy != "single":  # the update on N ranks; `model` gets their weights back
        from taurl.train.distributed.driver import DistributedLearner

        return DistributedLearner(model, cfg.learner_config(), strategy=cfg.train.strategy,
                                  world_size=cfg.train_world_size, pad_id=tok.pad_token_id,
                                  reference=reference, device=cfg.device, launch=rank_launch(cfg))
    return Learner(model, cfg.learner_config(), pad_id=tok.pad_token_id, reference=reference,
                   shaper=step_scorer(cfg, model, tok, run.root / "shaping.jsonl"))


def sft_steps(cfg: Any) -> Any:
    """The SFT loop of the run: `taurl.train.sft.sft_loop`, on the learner's ranks with
    ``train.strategy`` ddp or fsdp (`taurl.train.distributed.sft.ranked_sft_loop`)."""
    from taurl.train.sft import sft_loop

    if cfg.train.strategy == "single":
        return sft_loop
    import functools

    from taurl.train.distributed.launch import launch_ranks
    from taurl.train.distributed.sft import ranked_sft_loop

    start = functools.partial(launch_ranks, cfg.train_world_size, cfg.device, **rank_launch(cfg))
    return functools.partial(ranked_sft_loop, strategy=cfg.train.strategy,
                             world_size=cfg.train_world_size, device=cfg.device, start=start)


def rank_launch(cfg: Any) -> dict[str, Any]:
    """How the ranks start (`taurl.train.distributed.launch.launch_ranks`): ``train.launcher``
    and ``train.ray``; a local Ray cluster started for the ranks also gets the CPUs of
    ``backend: ray``'s rollout workers (they join it: `taurl.scale.ray_backend`)."""
    if cfg.train.launcher != "ray":
        return {"launcher": cfg.train.launcher}
    bundle = cfg.train.ray.bundle or {"CPU": 1}
    cpus = cfg.train_world_size * bundle.get("CPU", 0)
    if cfg.backend == "ray":
        opts = cfg.backend_options
        cpus += opts.get("num_cpus", opts.get("workers", 2))
    ray = record_mapping(cfg.train.ray)  # the keys given (RayRankOptions has the defaults)
    return {"launcher": "ray", "ray": ray, "num_cpus": max(1, int(cpus + 0.999))}


def run_own_stage(r: Any) -> bool:
    """Run the stage if it has a loop of its own (rejection rounds, offline DPO); False when
    the RL loop runs it (rl, online DPO, distillation)."""
    stage = stage_name(r.cfg)
    if stage == "rejection":
        from taurl.recipe.stage_loops import rejection_rounds

        rejection_rounds(r)
        return True
    if stage == "dpo" and r.cfg.dpo.data:
        from taurl.recipe.stage_loops import offline_dpo

        offline_dpo(r, make_learner)
        return True
    return False


def stage_summary(r: Any) -> dict[str, Any]:
    """summary.json's ``train.stage`` and what the stage did."""
    cfg, stage = r.cfg, stage_name(r.cfg)
    out: dict[str, Any] = {"stage": stage}
    if stage == "rejection":
        out["rejection"] = r.state.get("rejection", [])
    elif stage == "distill":
        out["teacher"] = cfg.teacher
    return out


def parallel_problems(cfg: Any) -> list[str]:
    """`strategy_problems`, and what a run with ranks does not take yet (a TrainConfig)."""
    from taurl.credit import needs_values
    from taurl.train.distributed.strategy import launcher_problems, strategy_problems

    out = strategy_problems(cfg.train.strategy, cfg.train_world_size)
    out += launcher_problems(cfg.train.launcher, cfg.train.ray, cfg.train.strategy)
    if out or cfg.train.strategy == "single":
        return out
    unsupported = [(f"a critic (rl.estimator: {cfg.estimator})", needs_values(cfg.estimator)),
                   ("rl.step_scorer", cfg.step_scorer != "none"), ("policy.lora", bool(cfg.lora)),
                   ("schedule: async", cfg.schedule.kind == "async"),
                   (f"the {stage_name(cfg)} stage", stage_name(cfg) != "rl")]
    if bad := [name for name, on in unsupported if on]:
        out.append(f"train.strategy {cfg.train.strategy} runs the RL learner alone for now; "
                   f"{', '.join(bad)} need(s) train.strategy single")
    return out
