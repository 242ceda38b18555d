"""Any HF causal LM trains through taurl: a matrix of tiny random-init architectures.

Each architecture is built locally from its config (no hub), saved as a plain HF
directory (`save_pretrained` + a tokenizer with a chat template, no ``taurl.json``), and
then goes through what the recipe does with ``model: DIR``: `load_policy`, rollouts through
the real agent loop (`run_episodes` with `LocalEngine`, search-v0 over a three-document
retriever), one GRPO update with `Learner`, a checkpoint and its reload. The names and
shapes differ on purpose: GPT-2 (``transformer.h``, learned absolute positions, tied
embeddings, dropout 0.1 by default), GPT-NeoX (``gpt_neox``, ``embed_out``, partial
rotary), Llama and Qwen2 (``model``/``lm_head``, grouped-query attention).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    Qwen2Config,
)

from taurl import envs
from taurl.data.runs import RunDir
from taurl.envs.core import Task
from taurl.envs.search.corpus import Document
from taurl.envs.search.retriever import Hit
from taurl.errors import ConfigError
from taurl.policy.engine import LocalEngine, SamplingParams
from taurl.policy.files import save_policy
from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import load_policy, policy_problems
from taurl.policy.tokenizer import build_tokenizer, save_tokenizer
from taurl.rollout.loop import RolloutConfig, run_episodes
from taurl.train.checkpoint import load_checkpoint, save_checkpoint
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.rows import action_logprobs, make_rows

DOCS = [
    Document("d0", "Lyon", "Lyon is a city in France on the Rhone.", "city"),
    Document("d1", "Porto", "Porto is a city in Portugal on the Douro.", "city"),
    Document("d2", "France", "France is a country in Europe; its capital is Paris.", "country"),
]
TASKS = [
    Task("t0", "Which country is Lyon in?", ("France",), "train", "search-v0"),
    Task("t1", "Which country is Porto in?", ("Portugal",), "train", "search-v0"),
]
GROUP = 4
ROLLOUT = RolloutConfig(max_turns=2, max_action_tokens=12, max_episode_tokens=24, max_context=512)
TOL = 1e-4  # fp32, CPU: docs/design.md#token-exact


class TinyRetriever:
    """Word-overlap search over DOCS (the search env takes any `search(query, k)`)."""

    def search(self, query: str, k: int) -> list[Hit]:
        words = set(query.lower().split())
        scored = [Hit(d, float(len(words & set(d.text.lower().split())))) for d in DOCS]
        return sorted(scored, key=lambda h: -h.score)[:k]


def _env():
    return envs.make("search-v0", retriever=TinyRetriever(), top_k=1)


@pytest.fixture(scope="module")
def tok():
    texts = [d.text for d in DOCS] + [t.prompt for t in TASKS] + [_env().system_prompt]
    return build_tokenizer(texts * 20, vocab_size=400)


def _configs(tok) -> dict[str, object]:
    v, pad, eos = len(tok), tok.pad_token_id, tok.eos_token_id
    ids = {"vocab_size": v, "pad_token_id": pad, "bos_token_id": pad, "eos_token_id": eos}
    return {
        "qwen2": Qwen2Config(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=1024, tie_word_embeddings=False, **ids,
        ),
        "llama": LlamaConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=1024, **ids,
        ),
        # dropout left at GPT-2's default 0.1: the engine and the learner must both turn it off
        "gpt2": GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=1024, **ids),
        "gpt_neox": GPTNeoXConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=1024, rotary_pct=0.5, **ids,
        ),
    }


def _save_plain_hf(arch: str, tok, path) -> None:
    """What a user brings: a plain HF directory, written by transformers' own save."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(_configs(tok)[arch])
    model.save_pretrained(path)
    save_tokenizer(tok, path)


def _objective(model, rows) -> float:
    """Σ A_t log π(x_t) m_t / Σ m_t: the first-order surrogate a GRPO step must raise."""
    with torch.no_grad():
        lp, _ = action_logprobs(model, rows)
    return float((rows.advantages * lp * rows.mask).sum() / rows.mask.sum())


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2", "gpt_neox"])
def test_architecture_rolls_out_updates_and_round_trips(arch, tok, tmp_path):
    src = tmp_path / arch
    _save_plain_hf(arch, tok, src)
    assert policy_problems(src) == []

    # --- load_policy on a directory taurl did not write
    model, ltok = load_policy(src)
    assert (
        type(model).__name__ == type(AutoModelForCausalLM.from_config(_configs(tok)[arch])).__name__
    )
    assert not model.training and ltok.chat_template
    sample = "Lyon is a city in France.<|im_end|>\n<|im_start|>assistant\n<search>Porto</search>"
    assert (
        ltok(sample, add_special_tokens=False)["input_ids"]
        == tok(sample, add_special_tokens=False)["input_ids"]
    )

    # --- rollouts through the real agent loop
    engine = LocalEngine(model, ltok, version=0, max_batch_size=8, seed=0)
    result = asyncio.run(
        run_episodes(engine, _env, ltok, TASKS, group_size=GROUP, config=ROLLOUT, seed=1)
    )
    trajs = result.trajectories
    assert not result.failures and len(trajs) == GROUP * len(TASKS)
    assert all(t.num_action_tokens > 0 for t in trajs)

    # --- fidelity: the engine's behaviour logprobs are those of a plain forward
    worst = 0.0
    for t in trajs:
        mask = torch.tensor(t.action_mask, dtype=torch.bool)
        plain = sequence_logprobs(model, t.token_ids)[mask]
        worst = max(worst, float((plain - torch.tensor(t.logprobs)[mask]).abs().max()))
    assert worst <= TOL, f"{arch}: engine vs plain forward max |Δ logprob| = {worst:.2e}"
    # ... also for prompts of very different lengths in one left-padded batch
    prompts = [trajs[0].token_ids[:n] for n in (3, 40, 150)]

    async def together():
        return await asyncio.gather(*[engine.generate(p, SamplingParams(max_tokens=6, seed=i))
                                      for i, p in enumerate(prompts)])

    for p, g in zip(prompts, asyncio.run(together()), strict=True):
        plain = sequence_logprobs(model, p + g.token_ids)[len(p):]
        assert float((plain - torch.tensor(g.logprobs)).abs().max()) <= TOL
    # ... and those of the learner's batched, padded, logits_to_keep forward
    rows = make_rows(trajs, None, ltok.pad_token_id)
    with torch.no_grad():
        lp, _ = action_logprobs(model, rows)
    assert float(((lp - rows.behaviour) * rows.mask).abs().max()) <= TOL

    # --- one GRPO update (rewards set by hand: half of each group succeeds)
    scored = [dataclasses.replace(t, reward=float(i % 2 == 0)) for i, t in enumerate(trajs)]
    learner = Learner(
        model, LearnerConfig(lr=1e-3, micro_batch_tokens=256), pad_id=ltok.pad_token_id
    )
    kept, adv, _ = learner.advantages(scored)
    rows = make_rows(kept, adv, ltok.pad_token_id)
    before = _objective(model, rows)
    params0 = [p.detach().clone() for p in model.parameters()]
    m = learner.update(scored)
    assert m["learn/skipped"] == 0.0 and m["learn/rows"] == len(trajs) and m["learn/grad_norm"] > 0
    assert m["learn/invalid_samples_dropped"] == 0.0
    # on-policy, no dropout noise: every ratio starts at exactly 1 (up to fp32 rounding)
    assert m["learn/approx_kl"] < 1e-8 and m["learn/clip_frac"] == 0.0, m
    assert any(not torch.equal(a, b) for a, b in zip(params0, model.parameters(), strict=True))
    assert _objective(model, rows) > before
    assert not model.training

    # --- checkpoint round trip: taurl's save, then plain from_pretrained and load_checkpoint
    ckpt = save_checkpoint(RunDir(tmp_path / "run"), 1, model, ltok, learner.optimizer, phase="rl")
    ids = torch.tensor([trajs[0].token_ids])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        assert torch.equal(plain(input_ids=ids).logits, want)
        again, atok, meta = load_checkpoint(ckpt)
        assert torch.equal(again(input_ids=ids).logits, want)
    assert meta["policy_version"] == 1 and type(again) is type(model)
    assert AutoTokenizer.from_pretrained(ckpt)(sample, add_special_tokens=False)["input_ids"] == \
        tok(sample, add_special_tokens=False)["input_ids"]
    assert atok.chat_template == ltok.chat_template


# --------------------------------------------------------------------------- bad directories


def test_policy_problems_lists_every_problem_and_load_policy_says_how_to_fix(tok, tmp_path):
    assert "does not exist" in policy_problems(tmp_path / "nowhere")[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    problems = policy_problems(empty)
    assert len(problems) == 3 and any("config.json" in p for p in problems)
    assert any("weights" in p for p in problems) and any("tokenizer files" in p for p in problems)

    not_causal = tmp_path / "bert"
    not_causal.mkdir()
    (not_causal / "config.json").write_text('{"model_type": "t5"}')
    assert any("not a causal LM" in p for p in policy_problems(not_causal))


def test_missing_chat_template_is_refused_with_the_fix_and_chatml_fixes_it(tok, tmp_path):
    path = tmp_path / "gpt2"
    _save_plain_hf("gpt2", tok, path)
    (path / "chat_template.jinja").unlink()  # what a base model's directory looks like
    [problem] = policy_problems(path)
    assert "no chat template" in problem and "tok.chat_template" in problem
    with pytest.raises(ConfigError, match="chat_template='chatml'"):
        load_policy(path)
    model, ltok = load_policy(path, chat_template="chatml")
    assert "<|im_start|>" in ltok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    save_policy(model, ltok, path)  # saved once with the template, the directory loads plainly
    assert policy_problems(path) == []


def test_a_tokenizer_without_a_pad_token_pads_with_its_end_token(tok, tmp_path):
    path = tmp_path / "llama"
    _save_plain_hf("llama", tok, path)
    nopad = AutoTokenizer.from_pretrained(path)
    nopad.pad_token = None
    nopad.save_pretrained(path)
    assert AutoTokenizer.from_pretrained(path).pad_token is None
    assert policy_problems(path) == []
    _, ltok = load_policy(path)
    assert ltok.pad_token_id == ltok.eos_token_id is not None


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2", "gpt_neox"])
def test_taurl_train_model_trains_each_architecture(arch, tok, tmp_path, capsys):
    """`taurl train --model DIR` (the CLI's own entry point, in-process): SFT, one RL update
    and both evaluations on a plain HF directory of each architecture; every version it
    writes is again a plain HF directory of the same architecture."""
    from taurl.cli.main import main

    src, run = tmp_path / "model", tmp_path / "run"
    _save_plain_hf(arch, tok, src)
    code = main(
        [
            "train", "--model", str(src), "--run-dir", str(run), "--no-progress", "--demos", "8",
            "--sft-epochs", "1", "--sft-batch-size", "8", "--updates", "1", "--tasks-per-update",
            "2", "--group-size", "2", "--eval-tasks", "2", "--eval-trials", "1", "--max-turns", "1",
            "--max-action-tokens", "8", "--max-episode-tokens", "8", "--system-prompt", "",
            "--task-options", '{"families": ["country_continent"]}',
        ]
    )
    assert code == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train"]["updates"] == 1 and summary["holdout"]["final"]["episodes"] == 2
    for v in (0, 1, 2):
        cfg = json.loads((run / "checkpoints" / f"v{v}" / "config.json").read_text())
        assert cfg["model_type"] == arch
