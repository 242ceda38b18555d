"""TRL's side of `benchmarks/vs_trl_135m.py`: GRPOTrainer, multi-turn with tools, on the demo-real
workload (SmolLM2-135M-Instruct's SFT policy on search-v0). Runs in TRL's own venv; taurl is
imported only for its search env, its task plan and its answer check (not its trainer).

The workload, as close to `configs/real.yaml`'s GRPO update as TRL allows:
  * the model and tokenizer of DIR (the SFT checkpoint), fp32, its own ChatML prompt (the default
    system line included), checked token for token against the tokenizer's own template;
  * the tasks taurl's recipe gives RL with ``--sft none`` (the plan's first ``steps x 4`` tasks);
  * 4 prompts x 6 generations = 24 rollouts per optimizer step (per-device batch 6 x 4
    accumulation steps: one generate per step, micro-batches of 6 rows);
  * taurl's inline Search-R1 protocol: an action ends at ``</search>`` (a tool call) or
    ``</answer>`` (generation stops at those strings, as taurl's engine does), the tool result is
    taurl's own SearchEnv observation, appended inside the assistant turn token for token; up to 3
    actions (2 tool calls) of at most 48 new tokens;
  * reward: taurl's exact match on the last ``<answer>``; lr 2e-5, beta 0, eps 0.2 / 0.28, one
    iteration, grad clip 1.0; with ``--lora``: rank 16, alpha 32, every linear layer (taurl's
    defaults, `taurl.train.lora`).
Glue (no TRL source edited): a chat template that renders that protocol; ``stop_strings`` passed
to ``generate`` with the tokenizer; ``grpo_trainer.parse_response`` replaced by a parser of
``<search> q</search>``; the tool suffix is the observation's own tokens (TRL's diff of two
template renderings cuts at the end-of-turn token, which this template does not put after a tool
call); ``supports_tool_calling`` bypassed (the inline protocol does not print a tool name).
A sequence stopped by a stop string is padded with ``<|im_end|>`` (SmolLM2's pad), which TRL
takes as its end and keeps: one token per action more than taurl samples and trains, and it stays
in the context before the observation (``...</search><|im_end|>\n\n<information>...``).
With Qwen2.5 that padding is ``<|endoftext|>`` (its pad), not its end-of-turn token.
The default system line is the model's own (SmolLM2's or Qwen2.5's), read from its template.

    TAURL_DIR=. trl-venv/bin/python benchmarks/trl_side_135m.py --model SFT_DIR --steps 4 \
        --json out.json
"""

import argparse
import json
import os
import re
import resource
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, os.environ.get("TAURL_DIR", ".") + "/src")

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True, help="the SFT checkpoint (a plain HF directory)")
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
ap.add_argument("--lora", action="store_true")
ap.add_argument("--json", default=None)
a = ap.parse_args()

import torch  # noqa: E402

if a.threads:
    torch.set_num_threads(a.threads)
import trl  # noqa: E402
import trl.trainer.grpo_trainer as gt  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.chat_template_utils import qwen3_template  # noqa: E402

from taurl import envs  # noqa: E402
from taurl.envs.tasks import plan_tasks  # noqa: E402
from taurl.reward.exact_match import exact_match  # noqa: E402
from taurl.rollout.seeds import episode_seed  # noqa: E402

TPU, G = 4, 6
plan = plan_tasks(
    "search-v0", task_file="", task_options={"families": ["city_country"], "split_by": "city"},
    n_demos=0, n_rl=a.steps * TPU, n_eval=1, seed=episode_seed(0, "train"), eval_seed=1234,
)
tasks = plan.rl
TASKS = {t.task_id: t for t in tasks}

tok = AutoTokenizer.from_pretrained(a.model)
own = tok.apply_chat_template(
    [{"role": "user", "content": tasks[0].prompt}], tokenize=False, add_generation_prompt=True
)
# the model's own default system line (SmolLM2's or Qwen2.5's), as its template writes it
SYSTEM = own.split("<|im_start|>system\n", 1)[-1].split("<|im_end|>", 1)[0]
TEMPLATE = (
    "{%- if messages[0].role != 'system' %}{{- '<|im_start|>system\\n"
    + SYSTEM
    + "<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    "{%- if m.content %}{{- m.content }}{%- endif %}"
    "{%- if m.tool_calls %}{%- for tc in m.tool_calls %}"
    "{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}"
    "{{- '<search> ' + (tc.arguments['query'] if tc.arguments['query'] is defined else '')"
    " + '</search>' }}"
    "{%- endfor %}{%- else %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif m.role == 'tool' %}{{- m.content }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt and (messages | length == 0 or messages[-1].role != 'tool') %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

ours = tok.apply_chat_template([{"role": "user", "content": tasks[0].prompt}], tokenize=False,
                               add_generation_prompt=True, chat_template=TEMPLATE)
assert own == ours, f"the prompt differs from the model's own template:\n{own!r}\n{ours!r}"
tok.chat_template = TEMPLATE
# non-None so TRL parses; the parser itself is replaced below
tok.response_template = qwen3_template
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
STOPS = ["</search>", "</answer>"]
_generate = model.generate
# stop_strings need the tokenizer
model.generate = lambda *args, **kw: _generate(*args, tokenizer=tok, **kw)
SEARCH_RE = re.compile(r"<search>(.*?)</search>\s*$", re.S)


def parse_inline(tokenizer, ids, prefix=None, tools=None):
    text = tokenizer.decode(ids, skip_special_tokens=True)
    m = SEARCH_RE.search(text)
    if m:
        return {
            "role": "assistant",
            "content": text[: m.start()],
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "search", "arguments": {"query": m.group(1).strip()}},
                }
            ],
        }
    return {"role": "assistant", "content": text}


gt.parse_response = parse_inline
gt.supports_tool_calling = lambda pc: True
GRPOTrainer._get_tool_suffix_ids = lambda self, msgs: tok.encode(
    "".join(m["content"] for m in msgs), add_special_tokens=False
)


class TaurlSearch:
    """One taurl SearchEnv per rollout (TRL pools them); search() returns taurl's
    observation text."""

    def __init__(self):
        self.env = envs.make("search-v0", max_turns=3, top_k=1, max_doc_chars=120)
        self.env.system_prompt = ""

    def reset(self, **row):
        self.env.reset(TASKS[row["task_id"]], 0)
        return None

    def search(self, query: str) -> str:
        """Search the city corpus (BM25) and return the top passage.

        Args:
            query: The name to look up.
        """
        try:
            obs, *_ = self.env.step(f"<search> {query}</search>")
        except Exception as e:  # the episode is over in taurl's env
            obs = f"\n\n<information>{type(e).__name__}</information>\n\n"
        return obs


ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)


def em_reward(completions, answers, **kw):
    out = []
    for comp, golds in zip(completions, answers, strict=True):
        text = "".join(m.get("content") or "" for m in comp if m.get("role") == "assistant")
        found = ANSWER_RE.findall(text)
        out.append(exact_match(found[-1].strip(), golds) if found else 0.0)
    return out


ds = Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}], "task_id": t.task_id,
                         "answers": list(t.answers)} for t in tasks])


def hwm_mib(reset: bool = False) -> float:
    """The process's peak RSS since the last reset (VmHWM, MiB); reset: start a new phase
    (writing 5 to /proc/self/clear_refs, as taurl.monitor.memory does)."""
    with open("/proc/self/status") as f:
        kb = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:"))
    if reset:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    return kb / 1024


class StepTimer(TrainerCallback):
    def __init__(self):
        self.step_times, self.logs = [], []

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.step_times.append(time.perf_counter() - self.t0)
        learn_peak.append(hwm_mib())  # since the end of this step's generation

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "reward" in logs:
            self.logs.append(dict(logs))


cfg = GRPOConfig(
    output_dir=os.path.join(
        os.environ.get("PEER_DIR") or __import__("tempfile").gettempdir(), "trl_out_135m"
    ),
    num_generations=G,
    per_device_train_batch_size=G,
    gradient_accumulation_steps=TPU,
    max_completion_length=128,
    generation_kwargs={"max_new_tokens": 48, "stop_strings": STOPS},
    max_tool_calling_iterations=2,
    learning_rate=2e-5,
    lr_scheduler_type="constant",
    beta=0.0,
    epsilon=0.2,
    epsilon_high=0.28,
    max_grad_norm=1.0,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    logging_steps=1,
    use_cpu=True,
    bf16=False,
    fp16=False,
    report_to="none",
    max_steps=a.steps,
    save_strategy="no",
    gradient_checkpointing=False,
    disable_tqdm=True,
    log_completions=False,
    seed=0,
    shuffle_dataset=False,
)
peft_config = None
if a.lora:
    from peft import LoraConfig

    peft_config = LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
timer = StepTimer()
trainer = GRPOTrainer(
    model=model, reward_funcs=em_reward, args=cfg, train_dataset=ds, processing_class=tok,
    environment_factory=TaurlSearch, callbacks=[timer], peft_config=peft_config,
)

gas_t, tok_stats, learn_peak, gen_peak = [], [], [], []
orig_gas = trainer._generate_and_score_completions


def gas(inputs):
    t = time.perf_counter()
    hwm_mib(reset=True)
    out = orig_gas(inputs)
    gas_t.append(time.perf_counter() - t)
    gen_peak.append(hwm_mib(reset=True))  # the learner phase starts here
    cm, pm = out["completion_mask"], out["prompt_mask"]
    tm = out.get("tool_mask", torch.ones_like(cm))
    tok_stats.append(
        {
            "rows": int(cm.shape[0]),
            "prompt_tokens": int(pm.sum()),
            "sampled_tokens": int((cm * tm).sum()),
            "tool_tokens": int((cm * (1 - tm)).sum()),
        }
    )
    if len(tok_stats) == 1:  # one rollout, to check the token stream
        i = int((cm * (1 - tm)).sum(1).argmax())
        ids = (
            out["prompt_ids"][i][pm[i].bool()].tolist()
            + out["completion_ids"][i][cm[i].bool()].tolist()
        )
        tok_stats[-1]["example"] = tok.decode(ids, skip_special_tokens=False)
    return out


trainer._generate_and_score_completions = gas
t = time.perf_counter()
trainer.train()
wall = time.perf_counter() - t

st, g = timer.step_times[1:], gas_t[1:]
body = tok_stats[1:]
res = {
    "side": "trl",
    "trl": trl.__version__,
    "torch": torch.__version__,
    "threads": torch.get_num_threads(),
    "lora": a.lora,
    "steps": a.steps,
    "step_times_s": [round(x, 3) for x in timer.step_times],
    "s_per_step": round(statistics.mean(st), 3),
    "generate_and_score_s": round(statistics.mean(g), 3),
    "train_s": round(statistics.mean(st) - statistics.mean(g), 3),
    "sampled_tokens_per_step": round(statistics.mean(x["sampled_tokens"] for x in body), 1),
    "tool_tokens_per_step": round(statistics.mean(x["tool_tokens"] for x in body), 1),
    "prompt_tokens_per_step": round(statistics.mean(x["prompt_tokens"] for x in body), 1),
    "rows_per_step": tok_stats[-1]["rows"],
    "reward": [round(lg["reward"], 3) for lg in timer.logs],
    "tool_calls_per_rollout": [
        round(lg.get("tools/call_frequency", float("nan")), 3) for lg in timer.logs
    ],
    "wall_s": round(wall, 1),
    "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    "example": tok_stats[0].get("example", ""),
    "learn_peak_rss_mib": round(max(learn_peak), 1), "gen_peak_rss_mib": round(max(gen_peak), 1),
    "learn_peak_rss_per_step_mib": [round(x, 1) for x in learn_peak],
}
print(json.dumps(res), flush=True)
if a.json:
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
