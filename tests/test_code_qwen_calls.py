"""code-v0 reads the tool calls Qwen2.5-Coder writes: the tagged Hermes form its chat template
asks for, and the untagged JSON it writes instead zero-shot (``parser: hermes_or_json``, the
default); ``parser: hermes`` keeps version 1's tagged-only reading.

The last test renders the env's tools with the real Qwen2.5-Coder template and tokenizer when
the converted model is in the model cache (`taurl models import qwen2.5-coder-0.5b-instruct`),
and is skipped otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from taurl.data.trajectory import StopReason, validate_trajectory
from taurl.envs.code import CodeEnv, generate_tasks, reference_source
from taurl.envs.code.env import CALL_EXAMPLE
from taurl.envs.code.holdout import ReplayVerifier
from taurl.errors import ConfigError
from taurl.policy import build_tokenizer
from taurl.policy.sources import models_home
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.stream import ChatCodec
from taurl.rollout.synth import ScriptedEngine
from taurl.tools.parsers import parse_hermes

CFG = RolloutConfig(max_turns=6, max_action_tokens=4096, max_episode_tokens=8192, max_context=16384,
                    max_observation_tokens=2048)


def _qwen_actions(task) -> list[str]:
    """An honest episode in the forms the model wrote: fenced, bare, tagged."""
    write = {"name": "write_file", "arguments": {"path": "solution.py",
                                                 "content": reference_source(task)}}
    return [f"```json\n{json.dumps(write)}\n```",
            '{"name": "run_tests", "arguments": {}}',
            '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>']


def _run(env: CodeEnv, task, actions: list[str]):
    tok = build_tokenizer([task.prompt, env.system_prompt, json.dumps(env.tools), *actions],
                          vocab_size=700, model_max_length=16384)
    engine = ScriptedEngine(tok, actions, max_context=16384)
    return validate_trajectory(asyncio.run(run_episode(engine, env, tok, task, seed=0, config=CFG)))


def test_untagged_qwen_calls_solve_a_task():
    task = generate_tasks("validation", 1, seed=0)[0]
    traj = _run(CodeEnv(), task, _qwen_actions(task))
    assert traj.stop_reason is StopReason.ANSWERED and traj.reward_components["outcome"] == 1.0
    assert [t.receipt.tool for t in traj.turns] == ["write_file", "run_tests", "submit"]
    assert not any(t.invalid for t in traj.turns)
    assert traj.provenance["parser"] == "hermes_or_json"
    # the holdout replay reads the actions as the record's parser did; a record without one is
    # from version 1, whose tagged-only reading never ran the untagged write: the stub fails
    assert ReplayVerifier()(traj, task) == 1.0
    v1 = dataclasses.replace(traj, provenance={"tools": traj.provenance["tools"],
                                               "compact_tools": False})
    assert ReplayVerifier()(v1, task) == 0.0


def test_the_tagged_only_parser_refuses_them_and_shows_a_real_call():
    task = generate_tasks("validation", 1, seed=0)[0]
    traj = _run(CodeEnv(parser="hermes", max_turns=2), task, _qwen_actions(task)[:2])
    assert traj.stop_reason is StopReason.MAX_TURNS and all(t.invalid for t in traj.turns)
    error = traj.messages[3]["content"]
    assert error == f"Error: no tool call found; call a tool as {CALL_EXAMPLE}"
    assert "TOOL" not in error  # no placeholder for a small model to copy
    call = parse_hermes(CALL_EXAMPLE).calls[0]
    assert call.name == "write_file" and call.arguments["path"] == "solution.py"
    with pytest.raises(ConfigError, match="parser must be one of hermes_or_json, hermes"):
        CodeEnv(parser="xml")


QWEN_DIR = models_home() / "qwen2.5-coder-0.5b-instruct"


@pytest.mark.skipif(not (QWEN_DIR / "tokenizer.json").is_file(),
                    reason="needs the converted Qwen2.5-Coder: make real-code")
def test_qwen_template_renders_the_code_tools_and_stops_on_one_token():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(QWEN_DIR)
    env = CodeEnv()
    codec = ChatCodec(tok, env.tools)
    prompt = codec.render([{"role": "system", "content": env.system_prompt},
                           {"role": "user", "content": "TASK"}], add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\n" + env.system_prompt + "\n\n# Tools")
    for decl in env.tools:  # every declaration, as the template's tojson writes it
        assert json.dumps(decl, ensure_ascii=False) in prompt
    assert prompt.endswith("TASK<|im_end|>\n<|im_start|>assistant\n")
    stop_ids, stop_strings = codec.split_stops(env.stop)
    assert stop_ids == (tok.convert_tokens_to_ids("</tool_call>"),) and stop_strings == ()
    # the template's own rendering of an assistant call parses back to that call
    call = {"type": "function",
            "function": {"name": "run_python", "arguments": {"code": "print(1)"}}}
    text = codec.render([{"role": "user", "content": "x"},
                         {"role": "assistant", "content": "", "tool_calls": [call]}], False)
    parsed = parse_hermes(text.split("<|im_start|>assistant")[-1])  # not the preamble's
    assert parsed.ok and (parsed.calls[0].name, parsed.calls[0].arguments) == \
        ("run_python", {"code": "print(1)"})
