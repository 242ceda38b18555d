"""The sections of a training config file, one frozen dataclass each.

    policy:   {model: "", size: tiny}                   PolicySection
    rollout:  {max_turns: 3, temperature: 1.0}          RolloutSection
    engine:   {kind: local, options: {}}                EngineSection
    sft:      {data: expert, demos: 12000, lr: 3.0e-3}  SFTSection
    rl:       {updates: 30, group_size: 8, lr: 5.0e-4}  RLSection (a LearnerConfig)
    schedule: {kind: sync, staleness_eta: 1}            ScheduleSection
    train:    {strategy: single, world_size: 1}         TrainSection
    eval:     {tasks: 100, trials: 3, seed: 1234}       EvalSection

Each option is declared once, as a field of its section (its trailing or preceding comment
is its documentation: `taurl train --help`, docs/reference/config.md). The same name is its
spelling everywhere: ``rl.lr`` in YAML, ``cfg.rl.lr`` and ``rl={"lr": ...}`` in Python,
``--rl.lr`` on the command line (``_`` written ``-``). `SECTION_TYPES` names the class of
each section; `taurl.recipe.config.TrainConfig` holds one instance of each.

The ``rl`` section is the learner's config itself: `RLSection` subclasses
`taurl.train.learner_config.LearnerConfig` and adds the run's RL options (updates, group
size, checkpoints, replay, ...), so a new learner option is one field and reaches
`taurl.train.learner.Learner` as it is. The train section inherits the learner's numerics
(`LearnerNumerics`). Fields marked ``set_by`` in LearnerConfig are set by the run from other
sections (`TrainConfig.learner_config`) and are not options of the rl section.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from taurl.rollout.budgets import RolloutConfig as _Loop  # the one set of episode-budget defaults
from taurl.rollout.options import CompactionConfig, RejectionOptions
from taurl.train.distributed.strategy import RayPlacement
from taurl.train.learner_config import LearnerConfig, LearnerNumerics
from taurl.train.stage_options import DistillOptions, DPOOptions


def typed(cls: type) -> Any:
    """An option whose keys are fixed by taurl: the file writes a mapping of `cls`'s fields
    (``{}``: every default), the config holds an instance of `cls` (``cfg.rl.dpo.beta``).
    The class is its one declaration of keys, types, defaults and documentation; an unknown
    key is refused with the nearest one, a wrong type by name (`taurl.recipe.typed`)."""
    return field(default_factory=cls, metadata={"options": cls})


def typed_mapping(where: str) -> Any:
    """A mapping option whose ``{}`` means "off" (``rl.replay``, ``rl.curriculum``): an
    instance of its class could not say off, so the run reads the dict, while its keys, types
    and ``problems()`` are checked from the class (``"module:Class"``, imported when checked:
    its module imports torch)."""
    return field(default_factory=dict, metadata={"options": where})


class _Kind:
    """A section named by its ``kind`` (``engine``, ``sft``, ``schedule``): until the code
    that read the old flat option (``cfg.engine == "vllm"``) is migrated, the section compares
    equal to its kind's string; ``str()`` gives the kind."""

    _KIND = "kind"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return getattr(self, self._KIND) == other
        if type(other) is not type(self):
            return NotImplemented
        return dataclasses.astuple(self) == dataclasses.astuple(other)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return str(getattr(self, self._KIND))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class PolicySection:
    """``policy:`` the model trained and where it lives."""

    # a local HF causal-LM directory, a .gguf file, a registry name (taurl models list) or a
    # hub id; "" builds the env's default tiny policy
    model: str = ""
    # default policy preset: tiny (0.79M params + embeddings) | small (5.9M + embeddings)
    size: str = "tiny"
    # train the default tokenizer on every n-th text to use about this many (0: all)
    tokenizer_texts: int = 0
    vocab_size: int = 1024  # BPE vocabulary of the default policy's tokenizer
    # the default policy's chat template: chatml (Qwen2.5's Hermes tool preamble) |
    # chatml-compact (tools as one-line signatures)
    chat_template: str = "chatml"
    # options of the env's pre-SFT warm-up hook (search-v0: steps, batch_size)
    warmup_options: dict[str, Any] = field(default_factory=dict)
    # train LoRA adapters (docs/lora.md): rank, alpha, dropout, targets; {}: full fine-tuning;
    # pip install 'taurl[real]'
    lora: dict[str, Any] = field(default_factory=dict)
    # where the policy, KL reference, critic and step scorer live: auto (CUDA when available,
    # else CPU) | cpu | cuda | cuda:N
    device: str = "auto"
    # their dtype: float32 | bfloat16 (where the device supports it;
    # docs/models-and-engines.md: logprob fidelity)
    torch_dtype: str = "float32"


@dataclass(frozen=True)
class RolloutSection:
    """``rollout:`` the episodes' budgets, sampling and where they run."""

    max_turns: int = _Loop.max_turns  # actions per episode
    max_action_tokens: int = _Loop.max_action_tokens  # sampled tokens per action
    max_episode_tokens: int = _Loop.max_episode_tokens  # sampled tokens per episode
    max_observation_tokens: int = _Loop.max_observation_tokens  # observation cut, in tokens
    max_context: int = _Loop.max_context  # prompt + actions + observations
    max_tool_calls: int | None = _Loop.max_tool_calls  # tool calls per episode (null: no budget)
    temperature: float = 1.0  # rollout sampling temperature (training)
    concurrency: int = 64  # episodes in flight at once (the engine batches them)
    # lock-step batching in the local engine: a seed fixes every rollout and evaluation under
    # any machine load (docs/reproducibility.md)
    deterministic: bool = False
    # an engine call longer than this ends its episode as an error (counted)
    generate_timeout_s: float = 600.0
    # where the RL rollouts run: local (this process) | ray (rollout workers on a local Ray
    # cluster; docs/scale-out.md)
    backend: str = "local"
    # the backend's own options (ray: workers, num_cpus, max_restarts, max_attempts); a
    # mapping, as each backend (a plug-in of taurl.scale) declares and checks its own keys
    backend_options: dict[str, Any] = field(default_factory=dict)
    # context management (policy: none | drop | truncate | summarize | env, trigger,
    # keep_turns, ...): a full context then starts a new token stream (taurl.rollout.compaction)
    compaction: CompactionConfig = typed(CompactionConfig)


@dataclass(frozen=True, eq=False)
class EngineSection(_Kind):
    """``engine:`` what samples the RL rollouts."""

    # the RL rollouts' engine: local (in-process LocalEngine) | vllm (a vLLM server;
    # docs/models-and-engines.md)
    kind: str = "local"
    # its options (local: max_batch_size, prefix_cache_tokens, slim_decode, replicas; vllm:
    # url, or python to start one; verify; ...)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class SFTSection(_Kind):
    """``sft:`` the supervised stage before RL."""

    _KIND = "data"

    # SFT data: expert (the env's expert through the real loop) | file (sft.file) | none |
    # rejection (the policy's own verified samples, sft.rejection; docs/beyond_rl.md)
    data: str = "expert"
    file: str = ""  # a trajectory file in the export format (JSONL) when sft.data: file
    demos: int = 12000  # expert demonstrations (one per training task)
    # the expert's quality knobs (search-v0: p_skip_search, p_guess_right)
    expert_options: dict[str, Any] = field(default_factory=dict)
    epochs: int = 2  # passes over the demonstrations
    batch_size: int = 32  # demonstrations per SFT step
    # SFT AdamW peak learning rate (linear warm-up, then linear decay to a tenth)
    lr: float = 3e-3
    warmup_steps: int = 50  # SFT steps of linear learning-rate warm-up
    # SFT optimizer steps, the budget (0: every step of sft.epochs); steps, not seconds, so a
    # seed fixes the result on any machine
    max_steps: int = 0
    # safety cap: stop SFT after this many seconds (0: none); a run it cuts says so (summary
    # train.cut_by) and depends on the machine
    max_seconds: float = 0.0
    # sft.data: rejection's options: rounds, attempts, tasks, temperature, filters
    rejection: RejectionOptions = typed(RejectionOptions)


@dataclass(frozen=True)
class RLSection(LearnerConfig):
    """``rl:`` the RL stage: the learner's options (LearnerConfig's fields) and the run's."""

    updates: int = 30  # RL updates (each one is a new policy version)
    tasks_per_update: int = 8  # tasks per RL batch
    group_size: int = 8  # G: rollouts per task (group-relative advantages)
    # seeds the RL rollouts only (null: the top-level seed): repeat RL from one SFT policy and
    # task plan
    seed: int | None = None
    # safety cap: stop RL after this many seconds (0: none; `updates` is the budget); a run it
    # cuts says so (summary train.cut_by)
    max_seconds: float = 0.0
    # RL checkpoints kept: the newest k, plus v0, the SFT version and every promoted one (0: all)
    keep_checkpoints: int = 2
    # a checkpoint (weights + optimizer, resumable) every k updates, and at the last; the
    # updates between serve their weights without one (docs/lora.md: cost control)
    checkpoint_every: int = 1
    # learned step scorer used as shaping only: none | implicit_prm
    # (docs/training/step-scorer.md)
    step_scorer: str = "none"
    # its options (implicit_prm: weight, clip, beta, lr, steps, pairs, label_smoothing,
    # grad_clip); a mapping, as each scorer (a plug-in of taurl.train.prm) takes its own keys
    step_scorer_options: dict[str, Any] = field(default_factory=dict)
    # experience replay of stored groups (docs/training/replay-curriculum.md): capacity,
    # max_age, fraction; {}: off
    replay: dict[str, Any] = typed_mapping("taurl.recipe.replay:ReplayConfig")
    # tasks by online success-rate bucket (docs/training/replay-curriculum.md): mix, easy,
    # hard, min_seen; {}: off
    curriculum: dict[str, Any] = typed_mapping("taurl.recipe.curriculum:CurriculumConfig")
    # objective: dpo's options: beta, pairs, anchor, data (offline)
    dpo: DPOOptions = typed(DPOOptions)
    # on-policy distillation from this checkpoint directory (same tokenizer), instead of RL
    # (docs/beyond_rl.md)
    teacher: str = ""
    # teacher's options: loss, reward_weight
    distill: DistillOptions = typed(DistillOptions)


@dataclass(frozen=True, eq=False)
class ScheduleSection(_Kind):
    """``schedule:`` how collecting and learning interleave (docs/training/schedules.md)."""

    # sync (collect a batch, then learn) | async (rollouts run ahead of the learner, staleness
    # <= staleness_eta)
    kind: str = "sync"
    # async: η, the most policy versions an episode trained on may lag the learner (0:
    # on-policy)
    staleness_eta: int = 1
    # async: groups started beyond the staleness rule, so a batch takes the first complete ones
    # (the rest carry or are aborted)
    overprovision: int = 0
    # async, at a weight update: finish (in-flight actions end on the old weights) | interrupt
    # (they are cut and continue on the new ones)
    interrupt: str = "finish"
    mask_stale: bool = False  # async: leave the older versions' part of a partial rollout out


@dataclass(frozen=True)
class TrainSection(LearnerNumerics):
    """``train:`` where and how the learner computes (docs/scale-out.md)."""

    strategy: str = "single"  # learner parallelism: single | ddp | fsdp (docs/scale-out.md)
    world_size: int = 1  # learner ranks for ddp / fsdp (processes; with CUDA a GPU each)
    launcher: str = "local"  # who starts the ranks: local (processes) | ray (Ray actors)
    # Ray ranks' placement (docs/scale-out.md): placement, bundle, ready_timeout_s
    ray: RayPlacement = typed(RayPlacement)


@dataclass(frozen=True)
class EvalSection:
    """``eval:`` the validation and holdout evaluations."""

    tasks: int = 100  # tasks per evaluation (validation and holdout each)
    trials: int = 3  # k trials per task (pass@k)
    temperature: float = 1.0  # sampling temperature of the evaluations
    seed: int = 1234  # seeds evaluation task choice and sampling


# the class of each section, in the file's order; TrainConfig, the loader, the CLI flags and
# the reference page all read it (a test may put a subclass here for the length of a test)
SECTION_TYPES: dict[str, type] = {
    "policy": PolicySection, "rollout": RolloutSection, "engine": EngineSection,
    "sft": SFTSection, "rl": RLSection, "schedule": ScheduleSection, "train": TrainSection,
    "eval": EvalSection}


def section_fields(name: str) -> list[dataclasses.Field]:
    """The options of section `name`, in order: its class's fields, less the learner's
    inputs that the run sets from other sections (``set_by``, and the learner's numerics,
    whose place is ``train:``)."""
    cls = SECTION_TYPES[name]
    skip = {f.name for f in dataclasses.fields(LearnerNumerics)} if name == "rl" else set()
    return [f for f in dataclasses.fields(cls)
            if "set_by" not in f.metadata and f.name not in skip]
