"""Typed run configurations: loaded from YAML, validated once, all problems reported together.

Each field's comment is its documentation; `taurl COMMAND --help` and docs/reference/config.md list them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from taurl.errors import UnknownEnvError
from taurl.recipe.validate import (  # noqa: F401  (re-exported: their old home was this module)
    check_config,
    dump_config,
    import_modules,
    load_config,
)
from taurl.rollout.budgets import RolloutConfig as _Loop  # the one set of episode-budget defaults


@dataclass(frozen=True)
class RolloutRunConfig:
    """`taurl rollout`: run episodes of an environment with a policy and store them."""

    env: str = "search-v0"  # registered environment name (taurl.envs.registered())
    env_config: dict[str, Any] = field(default_factory=dict)  # keyword arguments for the env
    model: str = ""  # a local HF model directory, a .gguf file, a registry name or a hub id (docs/models.md); "" builds the default tiny policy
    model_size: str = "tiny"  # preset of the default policy when model == "": tiny | small
    system_prompt: str | None = None  # replace the env's system prompt ("" drops it; null: the checkpoint's, else the env's)
    split: str = "train"  # task split to sample: train | validation | holdout
    task_options: dict[str, Any] = field(default_factory=dict)  # the env's task-source options (search-v0: families, split_by)
    episodes: int = 64  # number of episodes (tasks x group_size)
    group_size: int = 1  # episodes per task (G, for group-relative credit)
    concurrency: int = 32  # episodes in flight at once (the engine batches them)
    seed: int = 0  # seeds task sampling, the default policy and sampling
    temperature: float = 1.0  # sampling temperature (0 = greedy)
    top_p: float = 1.0  # nucleus sampling mass
    max_turns: int = _Loop.max_turns  # actions per episode
    max_action_tokens: int = _Loop.max_action_tokens  # sampled tokens per action
    max_episode_tokens: int = _Loop.max_episode_tokens  # sampled tokens per episode
    max_observation_tokens: int = _Loop.max_observation_tokens  # observation cut, in tokens
    max_context: int = _Loop.max_context  # prompt + actions + observations
    compaction: dict[str, Any] = field(default_factory=dict)  # context management: {policy: none|drop|truncate|summarize|env, trigger, keep_turns, ...} (taurl.rollout.compaction)
    max_tool_calls: int | None = _Loop.max_tool_calls  # tool calls per episode (null: no budget)

    def rollout_config(self):
        return _rollout_config(self, temperature=self.temperature, top_p=self.top_p)

    def problems(self) -> list[str]:
        from taurl.rollout.compaction import compaction_problems

        out = compaction_problems(self.compaction)
        for name in ("episodes", "group_size", "concurrency", "max_turns", "max_action_tokens",
                     "max_episode_tokens", "max_observation_tokens", "max_context"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.temperature < 0:
            out.append(f"temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            out.append(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.task_options:
            from taurl.envs.registry import task_option_problems

            try:
                out += task_option_problems(self.env, self.task_options)
            except UnknownEnvError as e:
                out.append(str(e))
        if self.model_size not in ("tiny", "small"):
            out.append(f"model_size must be 'tiny' or 'small' (got {self.model_size!r})")
        if self.model:
            from taurl.policy.sources import model_problems

            out += [f"model: {p}" for p in model_problems(self.model)]
        if self.split not in ("train", "validation", "holdout"):
            out.append(f"split must be train, validation or holdout (got {self.split!r})")
        try:
            from taurl.envs import registry

            out += [p.replace("option", "env_config option", 1)
                    for p in registry.env_option_problems(self.env, self.env_config)]
        except UnknownEnvError as e:
            out.append(str(e))
        return out

    def as_trained(self) -> RolloutRunConfig:
        """This config, with what `model`'s checkpoint recorded about its training (env
        options, task options, system prompt) filled in where this config leaves them unset,
        so a checkpoint is rolled out as it was trained."""
        from taurl.policy.model import load_policy_meta

        recipe = load_policy_meta(self.model).get("recipe", {}) if self.model else {}
        if not recipe or recipe.get("env") != self.env:
            return self
        changes: dict[str, Any] = {}
        if self.system_prompt is None and recipe.get("system_prompt") is not None:
            changes["system_prompt"] = recipe["system_prompt"]
        if not self.task_options and recipe.get("task_options"):
            changes["task_options"] = recipe["task_options"]
        if not self.env_config and recipe.get("env_config"):
            changes["env_config"] = {k: v for k, v in recipe["env_config"].items() if k != "max_turns"}
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class TrainConfig:
    """`taurl train` / `taurl demo`: every option of the recipe (`taurl.recipe.loop`).

    Its file is written in sections (`taurl.recipe.sections`: ``rl.lr``, ``eval.tasks``, ...);
    in Python the options keep their flat names (``cfg.lr``, ``cfg.eval_tasks``).
    """

    SECTIONED: ClassVar[bool] = True

    seed: int = 0  # seeds the policy, task sampling, demonstrations and rollouts
    rl_seed: int | None = None  # seeds the RL rollouts only (null: seed): repeat RL from one SFT policy and task plan
    env: str = "search-v0"  # registered environment name (`taurl envs`; your own: --import MODULE)
    imports: list[str] = field(default_factory=list)  # modules imported first, so that their envs register (--import)
    env_config: dict[str, Any] = field(default_factory=dict)  # the env's keyword arguments
    system_prompt: str | None = None  # replace the env's system prompt ("" drops it; null keeps the env's)
    tasks: str = ""  # a JSONL task file (docs/formats.md); "" uses the env's registered task source
    task_options: dict[str, Any] = field(default_factory=dict)  # the env task source's options (search-v0: families, split_by)
    model: str = ""  # a local HF causal-LM directory, a .gguf file, a registry name (taurl models list) or a hub id; "" builds the env's default tiny policy
    model_size: str = "tiny"  # default policy preset: tiny (0.79M params + embeddings) | small (5.9M + embeddings)
    tokenizer_texts: int = 0  # train the default tokenizer on every n-th text to use about this many (0: all)
    vocab_size: int = 1024  # BPE vocabulary of the default policy's tokenizer
    chat_template: str = "chatml"  # the default policy's chat template: chatml (Qwen2.5's Hermes tool preamble) | chatml-compact (tools as one-line signatures)
    warmup_options: dict[str, Any] = field(default_factory=dict)  # options of the env's pre-SFT warm-up hook (search-v0: steps, batch_size)
    max_turns: int = _Loop.max_turns  # actions per episode
    max_action_tokens: int = _Loop.max_action_tokens  # sampled tokens per action
    max_episode_tokens: int = _Loop.max_episode_tokens  # sampled tokens per episode
    max_observation_tokens: int = _Loop.max_observation_tokens  # observation cut, in tokens
    max_context: int = _Loop.max_context  # prompt + actions + observations
    compaction: dict[str, Any] = field(default_factory=dict)  # context management: {policy: none|drop|truncate|summarize|env, trigger, keep_turns, ...}; a full context then starts a new token stream (taurl.rollout.compaction)
    max_tool_calls: int | None = _Loop.max_tool_calls  # tool calls per episode (null: no budget)
    temperature: float = 1.0  # rollout sampling temperature (training)
    concurrency: int = 64  # episodes in flight at once (the engine batches them)
    deterministic: bool = False  # lock-step batching in the local engine: a seed fixes every rollout and evaluation under any machine load (docs/reproducibility.md)
    device: str = "auto"  # where the policy, KL reference, critic and step scorer live: auto (CUDA when available, else CPU) | cpu | cuda | cuda:N
    torch_dtype: str = "float32"  # their dtype: float32 | bfloat16 (where the device supports it; docs/models-and-engines.md: logprob fidelity)
    torch_threads: int = 1  # torch CPU threads (0: torch's default); a tiny policy is fastest on one (BENCHMARKS.md)
    engine: str = "local"  # the RL rollouts' engine: local (in-process LocalEngine) | vllm (a vLLM server; docs/models-and-engines.md)
    engine_options: dict[str, Any] = field(default_factory=dict)  # its options (local: max_batch_size, prefix_cache_tokens, slim_decode, replicas; vllm: url, or python to start one; verify; ...)
    backend: str = "local"  # where the RL rollouts run: local (this process) | ray (rollout workers on a local Ray cluster; docs/scale-out.md)
    backend_options: dict[str, Any] = field(default_factory=dict)  # ray: workers, num_cpus, max_restarts, max_attempts
    sft: str = "expert"  # SFT data: expert (the env's expert through the real loop) | file (sft_data) | none | rejection (the policy's own verified samples, sft.rejection; docs/beyond_rl.md)
    rejection: dict[str, Any] = field(default_factory=dict)  # sft: rejection's options (taurl.rollout.rejection.RejectionOptions): rounds, attempts, tasks, temperature, filters
    sft_data: str = ""  # a trajectory file in the export format (JSONL) when sft: file
    demos: int = 12000  # expert demonstrations (one per training task)
    expert_options: dict[str, Any] = field(default_factory=dict)  # the expert's quality knobs (search-v0: p_skip_search, p_guess_right)
    sft_epochs: int = 2  # passes over the demonstrations
    sft_batch_size: int = 32  # demonstrations per SFT step
    sft_lr: float = 3e-3  # SFT AdamW peak learning rate (linear warm-up, then linear decay to a tenth)
    sft_warmup_steps: int = 50  # SFT steps of linear learning-rate warm-up
    sft_max_steps: int = 0  # SFT optimizer steps, the budget (0: every step of sft_epochs); steps, not seconds, so a seed fixes the result on any machine
    sft_max_seconds: float = 0.0  # safety cap: stop SFT after this many seconds (0: none); a run it cuts says so (summary train.cut_by) and depends on the machine
    updates: int = 30  # RL updates (each one is a new policy version)
    tasks_per_update: int = 8  # tasks per RL batch
    group_size: int = 8  # G: rollouts per task (group-relative advantages)
    rl_max_seconds: float = 0.0  # safety cap: stop RL after this many seconds (0: none; `updates` is the budget); a run it cuts says so (summary train.cut_by)
    schedule: str = "sync"  # sync (collect a batch, then learn) | async (rollouts run ahead of the learner, staleness <= staleness_eta; docs/training/schedules.md)
    staleness_eta: int = 1  # async: η, the most policy versions an episode trained on may lag the learner (0: on-policy)
    overprovision: int = 0  # async: groups started beyond the staleness rule, so a batch takes the first complete ones (the rest carry or are aborted)
    interrupt: str = "finish"  # async, at a weight update: finish (in-flight actions end on the old weights) | interrupt (they are cut and continue on the new ones)
    mask_stale: bool = False  # async: leave the older versions' part of a partial rollout out of the loss
    alarms: dict[str, Any] = field(default_factory=dict)  # health-alarm options (docs/monitoring.md): enabled, disable, stop_on, thresholds
    trackers: list[str] = field(default_factory=list)  # extra metric sinks: tensorboard, wandb (offline); pip install 'taurl[track]'
    generate_timeout_s: float = 600.0  # an engine call longer than this ends its episode as an error (counted)
    checkpoint_every: int = 1  # RL: a checkpoint (weights + optimizer, resumable) every k updates, and at the last; the updates between serve their weights without one (docs/lora.md: cost control)
    keep_checkpoints: int = 2  # RL checkpoints kept: the newest k, plus v0, the SFT version and every promoted one (0: all)
    estimator: str = "grpo"  # advantage estimator by name (taurl.credit.ESTIMATORS)
    estimator_options: dict[str, Any] = field(default_factory=dict)  # its keyword options
    critic_lr: float = 1e-3  # critic AdamW learning rate (estimator gae: a separate value model, taurl.train.critic)
    vf_clip: float | None = 0.2  # critic's PPO value-loss clip (null: plain squared error)
    critic_epochs: int = 0  # estimator gae: critic optimizer steps on each batch (0: epochs, the policy's)
    critic_warmup_updates: int = 0  # estimator gae: the first updates fit only the critic on their batches, no policy step (they count in the episode budget)
    step_scorer: str = "none"  # learned step scorer used as shaping only: none | implicit_prm (docs/training/step-scorer.md)
    step_scorer_options: dict[str, Any] = field(default_factory=dict)  # its options: weight, clip, beta, lr, steps, pairs, label_smoothing, grad_clip
    replay: dict[str, Any] = field(default_factory=dict)  # experience replay of stored groups (docs/training/replay-curriculum.md): capacity, max_age, fraction; {}: off
    curriculum: dict[str, Any] = field(default_factory=dict)  # tasks by online success-rate bucket (docs/training/replay-curriculum.md): mix, easy, hard, min_seen; {}: off
    objective: str = "ppo"  # policy loss by name: ppo | dual_clip_ppo | gspo | decoupled_ppo | dpo (trajectory-pair DPO, rl.dpo; docs/beyond_rl.md)
    dpo: dict[str, Any] = field(default_factory=dict)  # objective: dpo's options (taurl.train.pair_learner.DPOOptions): beta, pairs, anchor, data (offline)
    teacher: str = ""  # on-policy distillation from this checkpoint directory (same tokenizer), instead of RL (docs/beyond_rl.md)
    distill: dict[str, Any] = field(default_factory=dict)  # teacher's options (taurl.train.distill.DistillOptions): loss, reward_weight
    objective_options: dict[str, Any] = field(default_factory=dict)  # its extra keyword options
    eps_low: float = 0.2  # PPO clip range below 1
    eps_high: float = 0.28  # PPO clip range above 1 (clip-higher)
    aggregation: str = "token-mean"  # loss aggregation mode (taurl.train.objectives.AGGREGATIONS)
    segment_weighting: str = "token"  # an episode of several token streams (compaction): token (each action token weighs the same) | episode (each episode 1/E), taurl.train.chains
    lr: float = 5e-4  # RL AdamW learning rate
    lr_warmup_steps: int = 0  # RL optimizer steps of linear lr warm-up: step n uses lr * min(1, n / lr_warmup_steps); 0: off
    weight_decay: float = 0.0  # RL AdamW weight decay
    grad_clip: float = 1.0  # max gradient norm
    kl_coef: float = 0.0  # beta of the KL to the frozen SFT policy (0: no reference model)
    kl_kind: str = "k3"  # KL estimator: k1 | k2 | k3
    entropy_coef: float = 0.0  # entropy bonus (entropy is always measured)
    drop_zero_variance: bool = True  # drop groups whose advantages are all zero before the loss (counted in learn/filter_*)
    micro_batch_tokens: int = 6144  # padded tokens per micro-batch (gradient accumulation)
    epochs: int = 1  # optimizer steps per RL batch
    lora: dict[str, Any] = field(default_factory=dict)  # train LoRA adapters (docs/lora.md): rank, alpha, dropout, targets; {}: full fine-tuning; pip install 'taurl[real]'
    train_strategy: str = "single"  # learner parallelism: single | ddp | fsdp (docs/scale-out.md)
    train_world_size: int = 1  # learner ranks for ddp / fsdp (processes; with CUDA a GPU each)
    precision: str = "fp32"  # learner: fp32 | bf16-mixed | fp16-mixed (fp32 master weights)
    activation_checkpointing: bool = False  # learner: recompute activations in the backward
    attention: str = "auto"  # learner attention kernel: auto (the model's) | sdpa | eager
    tis: str = "auto"  # truncated IS min(π/μ, C) on the PG term: auto (dtypes differ) | on | off
    tis_cap: float = 2.0  # C of the truncated importance weight (Yao et al. 2025)
    eval_tasks: int = 100  # tasks per evaluation (validation and holdout each)
    eval_trials: int = 3  # k trials per task (pass@k)
    eval_temperature: float = 1.0  # sampling temperature of the evaluations
    eval_seed: int = 1234  # seeds evaluation task choice and sampling
    promotion: dict[str, Any] = field(default_factory=dict)  # promotion gate thresholds (docs/evaluation.md): margin, safety_tolerance, max_cost_ratio, max_wall_ratio, max_regression
    agent: dict[str, Any] = field(default_factory=dict)  # your own agent through the proxy (docs/agents.md): callable | command, timeout_s, max_calls

    def section(self, name: str) -> Any:
        """This config's options of one section of its file (``cfg.section("rl").lr``), typed."""
        from taurl.recipe.sections import section

        return section(self, name)

    def learner_config(self):
        from taurl.train.learner import LearnerConfig
        from taurl.train.precision import engine_dtype

        keys = set(LearnerConfig.__dataclass_fields__) - {"temperature", "norm_constant",
                                                          "engine_dtype"}
        # Dr. GRPO's constant normalizer: the generation budget, the same for every batch
        return LearnerConfig(temperature=self.temperature, norm_constant=float(self.max_episode_tokens),
                             engine_dtype=engine_dtype(self), **{k: getattr(self, k) for k in keys})

    def eval_config(self):
        from taurl.eval.evaluate import EvalConfig

        return EvalConfig(tasks=self.eval_tasks, trials=self.eval_trials, temperature=self.eval_temperature,
                          seed=self.eval_seed, concurrency=self.concurrency, deterministic=self.deterministic)

    def rollout_config(self, temperature: float | None = None):
        return _rollout_config(self, temperature=self.temperature if temperature is None else temperature)

    def env_kwargs(self) -> dict[str, Any]:
        return {"max_turns": self.max_turns, **self.env_config}

    # Over 60 lines on purpose: one check per option (or pair of options), every problem
    # gathered into one ConfigError before any work; a flat list of checks is how they are audited.
    def problems(self) -> list[str]:
        """Every problem with this config, the env's options included, before any work."""
        from taurl.envs import registry
        from taurl.eval.promote import promotion_problems
        from taurl.policy.factory import local_engine_option_problem
        from taurl.recipe.stages import stage_problems
        from taurl.rollout.compaction import compaction_problems

        pg = self if self.objective != "dpo" else dataclasses.replace(self, objective="ppo", objective_options={})
        out = (pg.learner_config().problems() + self.eval_config().problems() + stage_problems(self)
               + compaction_problems(self.compaction)
               + promotion_problems(self.promotion) + self.monitor_problems() + self.mixing_problems())
        for name in ("max_turns", "max_action_tokens", "max_episode_tokens", "max_observation_tokens",
                     "max_context", "concurrency", "sft_epochs", "sft_batch_size", "updates",
                     "tasks_per_update"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        for name in ("torch_threads", "demos", "sft_warmup_steps", "tokenizer_texts", "sft_max_steps"):
            if getattr(self, name) < 0:
                out.append(f"{name} must be >= 0 (got {getattr(self, name)})")
        if not self.temperature > 0:
            # greedy sampling makes the G rollouts of a group identical: every group has zero
            # reward variance, so every group is dropped and every update is skipped (and the
            # behaviour logprobs of an argmax are not a policy's)
            out.append(f"temperature must be > 0 to train (got {self.temperature}): at 0 the G rollouts of a "
                       "group are identical, every group has zero advantage and no update learns anything; "
                       "train at temperature 1.0 (the default) and set eval_temperature: 0 for greedy evaluation")
        if not self.generate_timeout_s > 0:
            out.append(f"generate_timeout_s must be > 0 (got {self.generate_timeout_s})")
        if isinstance(self.checkpoint_every, bool) or self.checkpoint_every < 1:
            out.append(f"checkpoint_every must be an integer >= 1 (1: every update); got {self.checkpoint_every!r}")
        elif self.checkpoint_every > 1 and self.schedule == "async":
            out.append("checkpoint_every > 1 runs with schedule: sync (the async learner checkpoints every "
                       "version); use checkpoint_every: 1 or schedule: sync")
        if self.keep_checkpoints < 0:
            out.append(f"keep_checkpoints must be >= 0 (0 keeps every version; got {self.keep_checkpoints})")
        if self.group_size < 2:
            out.append("group_size must be >= 2: group-relative advantages compare rollouts of one task")
        if self.model_size not in ("tiny", "small"):
            out.append(f"model_size must be 'tiny' or 'small' (got {self.model_size!r})")
        if self.chat_template not in ("chatml", "chatml-compact"):
            out.append(f"chat_template must be chatml or chatml-compact (got {self.chat_template!r})")
        if self.engine not in ("local", "vllm"):
            out.append(f"engine must be local or vllm (got {self.engine!r})")
        elif self.engine == "local" and (bad := local_engine_option_problem(self.engine_options)):
            out.append(bad)
        out += self.schedule_problems() + self.lora_problems() + self.deterministic_problems()
        from taurl.policy.device import device_problems
        from taurl.recipe.stages import parallel_problems
        from taurl.train.precision import run_precision_problems

        out += (parallel_problems(self) + device_problems(self.device, self.torch_dtype)
                + run_precision_problems(self))
        from taurl.scale import backend_problems

        out += backend_problems(self.backend, self.backend_options, engine=self.engine,
                                engine_options=self.engine_options)
        if self.backend == "ray" and self.agent:  # the proxy collector runs agents in this process only
            out.append("agent: (your agent through the proxy) runs with backend: local only; drop backend: ray")
        if self.sft not in ("expert", "file", "none", "rejection"):
            out.append(f"sft must be expert, file, none or rejection (got {self.sft!r})")
        if self.sft == "file" and not Path(self.sft_data).is_file():
            out.append(f"sft: file needs sft_data, a trajectory JSONL file (got {self.sft_data!r})")
        if self.sft != "file" and self.sft_data:
            out.append("sft_data is set but sft is not 'file': set sft: file, or drop sft_data")
        if self.tasks and not Path(self.tasks).is_file():
            out.append(f"tasks: {self.tasks!r} is not a file; give a JSONL task file or '' for the env's tasks")
        if self.tasks and self.task_options:
            out.append("task_options apply to the env's task source; with a task file (tasks:) drop them")
        if self.model:
            from taurl.policy.sources import model_problems

            out += [f"model: {p}" for p in model_problems(self.model)]
        if self.agent:
            from taurl.proxy.runner import agent_problems

            out += agent_problems(self.agent)
        try:
            spec = registry.spec(self.env)
        except UnknownEnvError as e:
            return out + [str(e)]
        out += [p.replace("option", "env_config option", 1) for p in
                registry.env_option_problems(self.env, self.env_kwargs())]
        if not self.tasks:
            out += registry.task_option_problems(self.env, self.task_options)
        if self.sft == "expert":
            if spec.expert is None:
                out.append(f"{self.env} has no expert: use sft: none, or sft: file with sft_data")
            else:
                out += registry.expert_option_problems(self.env, self.expert_options)
            if self.demos < 1:
                out.append("sft: expert needs demos >= 1")
        elif self.expert_options and self.sft == "file":  # (a demo config reused with sft none/rejection keeps them)
            out.append("expert_options are set but sft is not 'expert'")
        hooks = spec.policy_hooks
        # with a given model the warm-up is not applied (default_policy_options_ignored, which the recipe logs)
        warmup = self.warmup_options if not self.model else {}
        if warmup and not hasattr(hooks, "warmup"):
            out.append(f"warmup_options: {self.env} has no warm-up hook for its default policy; drop them")
        elif warmup:
            from taurl.envs.registry import signature_problems

            out += signature_problems(hooks.warmup, self.warmup_options, f"{self.env}'s warm-up", "option",
                                       {"model", "tokenizer", "train_tasks", "seed", "lr", "grad_clip", "log", "probe_tasks"})
        return out

    def default_policy_options_ignored(self) -> list[str]:
        """The options of the default tiny policy that this config sets although `model` is given
        (they are not applied: a given model brings its own tokenizer, size and template)."""
        if not self.model:
            return []
        defaults = {f.name: f.default for f in dataclasses.fields(self)
                    if f.name in ("model_size", "tokenizer_texts", "vocab_size", "chat_template")}
        out = [k for k, v in defaults.items() if getattr(self, k) != v]
        return out + (["warmup_options"] if self.warmup_options else [])

    def schedule_problems(self) -> list[str]:
        """Problems with the schedule options (taurl.recipe.schedule)."""
        out = []
        if self.schedule not in ("sync", "async"):
            out.append(f"schedule must be sync or async (got {self.schedule!r})")
        if self.staleness_eta < 0 or self.overprovision < 0:
            out.append(f"staleness_eta and overprovision must be >= 0 (got {self.staleness_eta}, {self.overprovision})")
        if self.interrupt not in ("finish", "interrupt"):
            out.append(f"interrupt must be finish or interrupt (got {self.interrupt!r})")
        if self.schedule == "async" and (self.backend != "local" or self.agent):
            out.append("schedule: async runs with backend: local and the built-in agent loop; drop backend/agent "
                       "or use schedule: sync")
        if self.schedule == "async" and self.concurrency < self.group_size:
            out.append(f"schedule: async needs concurrency >= group_size (a group runs at once); got "
                       f"{self.concurrency} < {self.group_size}")
        if self.schedule == "async" and (self.step_scorer != "none" or self.replay or self.curriculum):
            out.append("schedule: async does not take step_scorer, replay or curriculum yet (they hook the "
                       "synchronous loop); drop them or use schedule: sync")
        return out

    def deterministic_problems(self) -> list[str]:
        """``deterministic: true`` is the local engine's lock-step mode: the one engine of this
        process, fed by the synchronous collector and the built-in agent loop."""
        if not self.deterministic:
            return []
        other = [f"{k}: {v}" for k, v, ok in (("engine", self.engine, "local"), ("backend", self.backend, "local"),
                                                ("schedule", self.schedule, "sync")) if v != ok]
        other += ["engine_options.replicas > 1"] * (self.engine_options.get("replicas", 1) != 1)
        other += ["agent: (your agent through the proxy)"] * bool(self.agent)
        if other:
            return [f"rollout.deterministic: true needs engine local (one replica), backend local, schedule sync and "
                    f"the built-in agent loop; this config has {', '.join(other)}. Drop deterministic, or those"]
        return []

    def lora_problems(self) -> list[str]:
        """Problems with the ``lora:`` options (taurl.train.lora), the model's layer names included."""
        from taurl.train.lora import run_problems

        return run_problems(self)

    def mixing_problems(self) -> list[str]:
        """Problems with step_scorer, replay and curriculum (taurl.train.prm, taurl.recipe.replay, taurl.recipe.curriculum)."""
        from taurl.recipe.curriculum import curriculum_problems
        from taurl.recipe.replay import replay_problems
        from taurl.train.prm import step_scorer_problems

        return (step_scorer_problems(self.step_scorer, self.step_scorer_options, self.estimator)
                + replay_problems(self.replay)
                + curriculum_problems(self.curriculum))

    def monitor_problems(self) -> list[str]:
        """Problems with the alarms and trackers options (taurl.monitor)."""
        from taurl.monitor.alarms import alarm_config
        from taurl.monitor.sinks import tracker_problems

        return alarm_config(self.alarms)[1] + tracker_problems(self.trackers)


ROLLOUT_BUDGETS = ("max_turns", "max_action_tokens", "max_episode_tokens", "max_observation_tokens", "max_context",
                   "max_tool_calls")  # the episode budgets both configs share with RolloutConfig




def _rollout_config(cfg: Any, **sampling: Any):
    """The agent loop's RolloutConfig from a run config's budgets and `sampling`."""
    from taurl.rollout.compaction import CompactionConfig

    timeout = {"generate_timeout_s": cfg.generate_timeout_s} if hasattr(cfg, "generate_timeout_s") else {}
    return _Loop(**{k: getattr(cfg, k) for k in ROLLOUT_BUDGETS}, **timeout, **sampling,
                 compaction=CompactionConfig.from_dict(cfg.compaction))


def run_config(run: Any) -> TrainConfig:
    """The TrainConfig of the run at `run` (a `taurl.data.runs.RunDir`), as `taurl eval` and
    `taurl promote` load it: its `imports` imported, no SFT/demo settings needed."""
    modules = import_modules(str(run.config), None)
    return load_config(TrainConfig, path=run.config, overrides={
        "imports": modules or None, "sft": "none", "sft_data": "", "expert_options": {}, "demos": 0,
        "warmup_options": {}})
