"""Typed run configurations: loaded from YAML, validated once, all problems reported together.

Each field's comment is its documentation; `taurl COMMAND --help` and
docs/reference/config.md list them.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from taurl.errors import ConfigError, UnknownEnvError
from taurl.eval.promote import PromotionConfig
from taurl.recipe.options import (
    SECTION_TYPES,
    EngineSection,
    EvalSection,
    PolicySection,
    RLSection,
    RolloutSection,
    ScheduleSection,
    SFTSection,
    TrainSection,
    typed,
)
from taurl.recipe.sections import build_config, flat_read
from taurl.recipe.validate import (
    import_modules,
    load_config,
    typed_option_problems,
)
from taurl.rollout.budgets import RolloutConfig as _Loop  # the one set of episode-budget defaults
from taurl.rollout.options import CompactionConfig
from taurl.train.learner_config import LearnerNumerics


@dataclass(frozen=True)
class RolloutRunConfig:
    """`taurl rollout`: run episodes of an environment with a policy and store them."""

    env: str = "search-v0"  # registered environment name (taurl.envs.registered())
    env_config: dict[str, Any] = field(default_factory=dict)  # keyword arguments for the env
    # a local HF model directory, a .gguf file, a registry name or a hub id (docs/models.md);
    # "" builds the default tiny policy
    model: str = ""
    model_size: str = "tiny"  # preset of the default policy when model == "": tiny | small
    # replace the env's system prompt ("" drops it; null: the checkpoint's, else the env's)
    system_prompt: str | None = None
    split: str = "train"  # task split to sample: train | validation | holdout
    # the env's task-source options (search-v0: families, split_by)
    task_options: dict[str, Any] = field(default_factory=dict)
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
    # context management (policy: none | drop | truncate | summarize | env, trigger,
    # keep_turns, ...; taurl.rollout.compaction)
    compaction: CompactionConfig = typed(CompactionConfig)
    max_tool_calls: int | None = _Loop.max_tool_calls  # tool calls per episode (null: no budget)

    def rollout_config(self):
        return _rollout_config(self, temperature=self.temperature, top_p=self.top_p)

    def problems(self) -> list[str]:
        out = typed_option_problems(self)  # compaction
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
        from taurl.policy.files import load_policy_meta

        recipe = load_policy_meta(self.model).get("recipe", {}) if self.model else {}
        if not recipe or recipe.get("env") != self.env:
            return self
        changes: dict[str, Any] = {}
        if self.system_prompt is None and recipe.get("system_prompt") is not None:
            changes["system_prompt"] = recipe["system_prompt"]
        if not self.task_options and recipe.get("task_options"):
            changes["task_options"] = recipe["task_options"]
        if not self.env_config and recipe.get("env_config"):
            changes["env_config"] = {k: v for k, v in recipe["env_config"].items()
                                     if k != "max_turns"}
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, init=False)
class TrainConfig:
    """`taurl train` / `taurl demo`: every option of the recipe (`taurl.recipe.loop`).

    The top-level options below, and one typed section each (`taurl.recipe.options`):
    ``cfg.rl.lr`` is the file's ``rl.lr`` and the flag ``--rl.lr``. Build one with sections
    (``TrainConfig(rl={"lr": 1e-3})`` or ``rl=RLSection(lr=1e-3)``) or dotted names
    (``TrainConfig(**{"rl.lr": 1e-3})``). The flat names of the release before sections
    (``cfg.lr``, ``TrainConfig(lr=1e-3)``, ``dataclasses.replace(cfg, lr=...)``) still read
    and build, for the code written against them (`taurl.recipe.sections.homes`).
    """

    SECTIONED: ClassVar[bool] = True

    seed: int = 0  # seeds the policy, task sampling, demonstrations and rollouts
    env: str = "search-v0"  # registered environment name (`taurl envs`; your own: --import MODULE)
    # modules imported first, so that their envs register (--import)
    imports: list[str] = field(default_factory=list)
    env_config: dict[str, Any] = field(default_factory=dict)  # the env's keyword arguments
    # replace the env's system prompt ("" drops it; null keeps the env's)
    system_prompt: str | None = None
    # a JSONL task file (docs/formats.md); "" uses the env's registered task source
    tasks: str = ""
    # the env task source's options (search-v0: families, split_by)
    task_options: dict[str, Any] = field(default_factory=dict)
    # torch CPU threads (0: torch's default); a tiny policy is fastest on one (BENCHMARKS.md)
    torch_threads: int = 1
    # health-alarm options (docs/monitoring.md): enabled, disable, stop_on, thresholds
    alarms: dict[str, Any] = field(default_factory=dict)
    # extra metric sinks: tensorboard, wandb (offline); pip install 'taurl[track]'
    trackers: list[str] = field(default_factory=list)
    # promotion gate thresholds (docs/evaluation.md): margin, safety_tolerance, max_cost_ratio,
    # max_wall_ratio, max_regression
    promotion: PromotionConfig = typed(PromotionConfig)
    reward: dict[str, Any] = field(default_factory=dict)  # {}: the env's | {kind: judge, ...}
    # your own agent through the proxy (docs/agents.md): callable | command, timeout_s, max_calls
    agent: dict[str, Any] = field(default_factory=dict)
    policy: PolicySection = field(default_factory=PolicySection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    engine: EngineSection = field(default_factory=EngineSection)
    sft: SFTSection = field(default_factory=SFTSection)
    rl: RLSection = field(default_factory=RLSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)

    def __init__(self, **options: Any) -> None:
        build_config(self, options)

    def __getattr__(self, name: str) -> Any:
        return flat_read(self, name)

    def section(self, name: str) -> Any:
        """One section (``cfg.section("rl")`` is ``cfg.rl``)."""
        if name not in SECTION_TYPES:
            raise ConfigError(f"unknown config section {name!r}; the sections are "
                              f"{', '.join(SECTION_TYPES)}")
        return getattr(self, name)

    def learner_config(self) -> RLSection:
        """The learner's config: the rl section, with what the run sets from other sections
        (its sampling temperature, Dr. GRPO's constant normalizer — the generation budget,
        the same for every batch —, the engine's dtype and the train section's numerics)."""
        from taurl.train.precision import engine_dtype

        numerics = {f.name: getattr(self.train, f.name)
                    for f in dataclasses.fields(LearnerNumerics)}
        return dataclasses.replace(self.rl, temperature=self.rollout.temperature,
                                   norm_constant=float(self.rollout.max_episode_tokens),
                                   engine_dtype=engine_dtype(self), **numerics)

    def eval_config(self):
        from taurl.eval.evaluate import EvalConfig

        e = self.eval
        return EvalConfig(tasks=e.tasks, trials=e.trials, temperature=e.temperature, seed=e.seed,
                          concurrency=self.rollout.concurrency,
                          deterministic=self.rollout.deterministic)

    def rollout_config(self, temperature: float | None = None):
        t = self.rollout.temperature if temperature is None else temperature
        return _rollout_config(self.rollout, temperature=t)

    def env_kwargs(self) -> dict[str, Any]:
        return {"max_turns": self.rollout.max_turns, **self.env_config}

    # Over 60 lines on purpose: one check per option (or pair of options), every problem
    # gathered into one ConfigError before any work; a flat list of checks is how they are audited.
    def problems(self) -> list[str]:
        """Every problem with this config, the env's options included, before any work."""
        from taurl.envs import registry
        from taurl.policy.factory import local_engine_option_problem
        from taurl.recipe.stages import stage_problems

        pg = self if self.rl.objective != "dpo" else dataclasses.replace(
            self, rl=dataclasses.replace(self.rl, objective="ppo", objective_options={}))
        out = (pg.learner_config().problems() + self.eval_config().problems() + stage_problems(self)
               + self.monitor_problems() + self.mixing_problems())
        for name in ("max_turns", "max_action_tokens", "max_episode_tokens",
                     "max_observation_tokens", "max_context", "concurrency", "sft_epochs",
                     "sft_batch_size", "updates", "tasks_per_update"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        for name in ("torch_threads", "demos", "sft_warmup_steps", "tokenizer_texts",
                     "sft_max_steps"):
            if getattr(self, name) < 0:
                out.append(f"{name} must be >= 0 (got {getattr(self, name)})")
        if not self.temperature > 0:
            # greedy sampling makes the G rollouts of a group identical: every group has zero
            # reward variance, so every group is dropped and every update is skipped (and the
            # behaviour logprobs of an argmax are not a policy's)
            out.append(f"temperature must be > 0 to train (got {self.temperature}): at 0 the G "
                       "rollouts of a group are identical, every group has zero advantage and no "
                       "update learns anything; train at temperature 1.0 (the default) and set "
                       "eval_temperature: 0 for greedy evaluation")
        if not self.generate_timeout_s > 0:
            out.append(f"generate_timeout_s must be > 0 (got {self.generate_timeout_s})")
        if isinstance(self.checkpoint_every, bool) or self.checkpoint_every < 1:
            out.append("checkpoint_every must be an integer >= 1 (1: every update); got "
                       f"{self.checkpoint_every!r}")
        elif self.checkpoint_every > 1 and self.schedule.kind == "async":
            out.append("checkpoint_every > 1 runs with schedule: sync (the async learner "
                       "checkpoints every version); use checkpoint_every: 1 or schedule: sync")
        if self.keep_checkpoints < 0:
            out.append("keep_checkpoints must be >= 0 (0 keeps every version; got "
                       f"{self.keep_checkpoints})")
        if self.group_size < 2:
            out.append("group_size must be >= 2: group-relative advantages compare rollouts of one "
                       "task")
        if self.model_size not in ("tiny", "small"):
            out.append(f"model_size must be 'tiny' or 'small' (got {self.model_size!r})")
        if self.chat_template not in ("chatml", "chatml-compact"):
            out.append("chat_template must be chatml or chatml-compact (got "
                       f"{self.chat_template!r})")
        if self.engine.kind not in ("local", "vllm"):
            out.append(f"engine must be local or vllm (got {self.engine.kind!r})")
        elif (self.engine.kind == "local"
              and (bad := local_engine_option_problem(self.engine_options))):
            out.append(bad)
        out += self.schedule_problems() + self.lora_problems() + self.deterministic_problems()
        from taurl.policy.device import device_problems
        from taurl.recipe.stages import parallel_problems
        from taurl.train.precision import run_precision_problems

        out += (parallel_problems(self) + device_problems(self.device, self.torch_dtype)
                + run_precision_problems(self))
        from taurl.scale import backend_problems

        out += backend_problems(self.backend, self.backend_options, engine=self.engine.kind,
                                engine_options=self.engine_options)
        if self.backend == "ray" and self.agent:
            # the proxy collector runs agents in this process only
            out.append("agent: (your agent through the proxy) runs with backend: local only; drop "
                       "backend: ray")
        if self.sft.data not in ("expert", "file", "none", "rejection"):
            out.append(f"sft must be expert, file, none or rejection (got {self.sft.data!r})")
        if self.sft.data == "file" and not Path(self.sft_data).is_file():
            out.append(f"sft: file needs sft_data, a trajectory JSONL file (got {self.sft_data!r})")
        if self.sft.data != "file" and self.sft_data:
            out.append("sft_data is set but sft is not 'file': set sft: file, or drop sft_data")
        if self.tasks and not Path(self.tasks).is_file():
            out.append(f"tasks: {self.tasks!r} is not a file; give a JSONL task file or '' for the "
                       "env's tasks")
        if self.tasks and self.task_options:
            out.append("task_options apply to the env's task source; with a task file (tasks:) "
                       "drop them")
        if self.model:
            from taurl.policy.sources import model_problems

            out += [f"model: {p}" for p in model_problems(self.model)]
        from taurl.reward.judged import run_reward_problems

        out += run_reward_problems(self.reward, sft=self.sft.data, backend=self.backend)
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
        if self.sft.data == "expert":
            if spec.expert is None:
                out.append(f"{self.env} has no expert: use sft: none, or sft: file with sft_data")
            else:
                out += registry.expert_option_problems(self.env, self.expert_options)
            if self.demos < 1:
                out.append("sft: expert needs demos >= 1")
        elif self.expert_options and self.sft.data == "file":
            # (a demo config reused with sft none/rejection keeps them)
            out.append("expert_options are set but sft is not 'expert'")
        hooks = spec.policy_hooks
        # with a given model the warm-up is not applied (default_policy_options_ignored, which the
        # recipe logs)
        warmup = self.warmup_options if not self.model else {}
        if warmup and not hasattr(hooks, "warmup"):
            out.append(f"warmup_options: {self.env} has no warm-up hook for its default policy; "
                       "drop them")
        elif warmup:
            from taurl.envs.registry import signature_problems

            out += signature_problems(hooks.warmup, self.warmup_options,
                                       f"{self.env}'s warm-up", "option",
                                       {"model", "tokenizer", "train_tasks", "seed", "lr",
                                        "grad_clip", "log", "probe_tasks", "copy_phase"})
        return out

    def default_policy_options_ignored(self) -> list[str]:
        """The options of the default tiny policy that this config sets although `model` is given
        (they are not applied: a given model brings its own tokenizer, size and template)."""
        if not self.model:
            return []
        defaults = PolicySection()
        out = [flat for flat, key in (("model_size", "size"),
                                      ("tokenizer_texts", "tokenizer_texts"),
                                      ("vocab_size", "vocab_size"),
                                      ("chat_template", "chat_template"))
               if getattr(self.policy, key) != getattr(defaults, key)]
        return out + (["warmup_options"] if self.warmup_options else [])

    def schedule_problems(self) -> list[str]:
        """Problems with the schedule options (taurl.recipe.schedule)."""
        out = []
        if self.schedule.kind not in ("sync", "async"):
            out.append(f"schedule must be sync or async (got {self.schedule.kind!r})")
        if self.staleness_eta < 0 or self.overprovision < 0:
            out.append(f"staleness_eta and overprovision must be >= 0 (got {self.staleness_eta}, "
                       f"{self.overprovision})")
        if self.interrupt not in ("finish", "interrupt"):
            out.append(f"interrupt must be finish or interrupt (got {self.interrupt!r})")
        if self.schedule.kind == "async" and (self.backend != "local" or self.agent):
            out.append("schedule: async runs with backend: local and the built-in agent loop; drop "
                       "backend/agent or use schedule: sync")
        if self.schedule.kind == "async" and self.concurrency < self.group_size:
            out.append("schedule: async needs concurrency >= group_size (a group runs at once); "
                       f"got {self.concurrency} < {self.group_size}")
        if self.schedule.kind == "async" and (self.step_scorer != "none" or self.replay
                                              or self.curriculum):
            out.append("schedule: async does not take step_scorer, replay or curriculum yet (they "
                       "hook the synchronous loop); drop them or use schedule: sync")
        return out

    def deterministic_problems(self) -> list[str]:
        """``deterministic: true`` is the local engine's lock-step mode: the one engine of this
        process, fed by the synchronous collector and the built-in agent loop."""
        if not self.deterministic:
            return []
        other = [f"{k}: {v}" for k, v, ok in (("engine", self.engine.kind, "local"),
                                              ("backend", self.backend, "local"),
                                              ("schedule", self.schedule.kind, "sync"))
                 if v != ok]
        other += ["engine_options.replicas > 1"] * (self.engine_options.get("replicas", 1) != 1)
        other += ["agent: (your agent through the proxy)"] * bool(self.agent)
        if other:
            return ["rollout.deterministic: true needs engine local (one replica), backend local, "
                    "schedule sync and the built-in agent loop; this config has "
                    f"{', '.join(other)}. Drop deterministic, or those"]
        return []

    def lora_problems(self) -> list[str]:
        """Problems with the ``lora:`` options (taurl.train.lora), the model's layer names
        included."""
        from taurl.train.lora import run_problems

        return run_problems(self)

    def mixing_problems(self) -> list[str]:
        """Problems with step_scorer (taurl.train.prm) and every typed option's values
        (replay, curriculum, compaction, rejection, dpo, distill, promotion: their classes)."""
        from taurl.train.prm import step_scorer_problems

        return (step_scorer_problems(self.step_scorer, self.step_scorer_options, self.estimator)
                + typed_option_problems(self))

    def monitor_problems(self) -> list[str]:
        """Problems with the alarms and trackers options (taurl.monitor)."""
        from taurl.monitor.alarms import alarm_config
        from taurl.monitor.sinks import tracker_problems

        return alarm_config(self.alarms)[1] + tracker_problems(self.trackers)


ROLLOUT_BUDGETS = ("max_turns", "max_action_tokens", "max_episode_tokens", "max_observation_tokens",
                   "max_context",
                   "max_tool_calls")  # the episode budgets both configs share with RolloutConfig




def _signature() -> inspect.Signature:
    """TrainConfig's keywords as `help` and editors show them: the top-level options and the
    sections (the flat and dotted names it also takes are not listed)."""
    return inspect.Signature([
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=f.type,
                          default=f.default if f.default is not dataclasses.MISSING
                          else f.default_factory())  # type: ignore[misc]
        for f in dataclasses.fields(TrainConfig)])


TrainConfig.__signature__ = _signature()  # type: ignore[attr-defined]


def _rollout_config(cfg: Any, **sampling: Any):
    """The agent loop's RolloutConfig from a run config's budgets and `sampling`."""
    timeout = ({"generate_timeout_s": cfg.generate_timeout_s} if hasattr(cfg, "generate_timeout_s")
               else {})
    return _Loop(**{k: getattr(cfg, k) for k in ROLLOUT_BUDGETS}, **timeout, **sampling,
                 compaction=cfg.compaction)


def run_config(run: Any) -> TrainConfig:
    """The TrainConfig of the run at `run` (a `taurl.data.runs.RunDir`), as `taurl eval` and
    `taurl promote` load it: its `imports` imported, no SFT/demo settings needed."""
    modules = import_modules(str(run.config), None)
    return load_config(TrainConfig, path=run.config, overrides={
        "imports": modules or None, "sft.data": "none", "sft.file": "", "sft.expert_options": {},
        "sft.demos": 0, "policy.warmup_options": {}})
