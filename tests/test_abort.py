"""An action the engine aborts (``pause("abort")`` around a weight update) ends its
episode with stop reason ``aborted``: the partial ids stay in the record with their
behaviour logprobs and version, the env never sees the cut text, nothing is lost.

The abort is placed deterministically: the model's forward blocks at the first decode
step until the test has asked the real `LocalEngine` to abort.
"""

from __future__ import annotations

import asyncio

import torch

from taurl import envs
from taurl.data.trajectory import StopReason, validate_trajectory
from taurl.envs.search import generate_tasks
from taurl.policy.engine import LocalEngine
from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import build_default_policy
from taurl.rollout.loop import RolloutConfig, run_episode


def test_aborted_action_keeps_its_tokens_and_ends_the_episode(tmp_path, gate_forward):
    tasks = generate_tasks("train", n=50, seed=0)
    env = envs.make("search-v0")
    model, tok = build_default_policy(
        [t.prompt for t in tasks] + [env.system_prompt] * 5, tmp_path / "v0", size="tiny", seed=0
    )
    reached, release = gate_forward(model, 2)  # the first decode step: one token is already sampled
    # the gate counts forwards
    engine = LocalEngine(model, tok, version=7, seed=0, slim_decode=False)
    # no stop string: the first action can only end by length (64 tokens), EOS or the abort
    env.stop = ()

    async def main():
        episode = asyncio.create_task(
            run_episode(
                engine, env, tok, tasks[0], seed=1,
                config=RolloutConfig(temperature=1.0, max_action_tokens=64),
            )
        )
        await asyncio.to_thread(reached.wait, 30)
        pausing = asyncio.create_task(engine.pause("abort"))
        while not engine._abort:  # pause() sets the flag before it waits for the worker
            await asyncio.sleep(0.001)
        release.set()
        await pausing
        await engine.resume()
        return await episode

    tr = asyncio.run(main())
    assert tr.stop_reason is StopReason.ABORTED and tr.truncated and not tr.terminated
    assert (
        len(tr.turns) == 1 and tr.turns[0].finish_reason == "abort" and tr.turns[0].receipt is None
    )
    action = tr.segments[tr.turns[0].action_segment]
    assert len(action.token_ids) == 2 and action.policy_version == 7  # the partial ids, kept
    validate_trajectory(tr)
    # the kept logprobs are the real behaviour logprobs of those two tokens
    del model.forward  # the gate off: the class's own forward again
    lp = sequence_logprobs(model.eval(), tr.token_ids, temperature=1.0)
    start = sum(len(s.token_ids) for s in tr.segments[:tr.turns[0].action_segment])
    got = lp[start:start + 2]
    assert torch.allclose(got, torch.tensor(action.logprobs), atol=1e-4)
