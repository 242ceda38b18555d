"""`taurl serve-env NAME`: a taurl env served as an OpenEnv server, driven by openenv-core's
own client (GenericEnvClient), and by taurl's OpenEnv adapter (the typed-action path)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="pip install 'taurl[ecosystem]' (openenv-core)")
pytest.importorskip("reasoning_gym", reason="pip install 'taurl[ecosystem]' (reasoning-gym)")
TAURL = str(Path(sys.executable).with_name("taurl"))
CONFIG = {"dataset": "gcd"}


@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            TAURL, "serve-env", "reasoning-gym", "--env-config", json.dumps(CONFIG), "--split",
            "holdout", "--tasks", "8", "--port", str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[
                -2000:
            ]
            time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(10)


def test_openenv_client_plays_a_taurl_env(server):
    from openenv.core import GenericEnvClient

    from taurl import envs

    holdout = {
        t.task_id: t for t in envs.make_tasks("reasoning-gym", "holdout", 8, env_config=CONFIG)
    }
    with GenericEnvClient(base_url=server).sync() as client:
        first = client.reset(seed=3)
        obs = first.observation
        task = holdout[obs["task_id"]]  # the served tasks are the env's own holdout draw
        assert obs["text"] == task.prompt and obs["stop"] == ["</answer>"] and not first.done
        assert obs["info"]["provenance"]["package"] == "reasoning-gym"
        done = client.step({"text": f"<answer>{task.answers[0]}</answer>"})
        assert (done.reward, done.done) == (1.0, True)
        assert done.observation["info"]["stop_reason"] == "answered"
        client.reset(seed=3)
        assert client.step({"text": "<answer>-1</answer>"}).reward == 0.0


def test_taurl_openenv_adapter_round_trip(server):
    """taurl's own OpenEnv adapter on the served env: its typed action (text) is one `step` tool."""
    from taurl import envs

    env = envs.make("openenv", url=server, max_turns=2)
    assert [t["function"]["name"] for t in env.tools] == ["step"]
    assert "text" in env.tools[0]["function"]["parameters"]["properties"]
    task = envs.make_tasks(
        "openenv", "holdout", 1, env_config={"url": server, "observation_key": "text"}
    )[0]
    assert task.prompt.startswith("Find the Greatest Common Divisor")
    env.reset(task)
    obs, r, term, trunc, info = env.step(
        '<tool_call>{"name": "step", "arguments": {"text": "<answer>x</answer>"}}</tool_call>'
    )
    assert term and r == 0.0 and info["receipt"].tool == "step"


def test_reset_without_a_seed_draws_a_task_and_receipts_are_json_objects(server):
    """Issue 38: `reset()` without a seed served task 0 every time, and the step info's tool
    receipt reached the client as its Python repr (a string), not an object."""
    import dataclasses

    from openenv.core import GenericEnvClient

    from taurl.data.trajectory import ToolReceipt
    from taurl.envs.openenv_serve import _jsonable

    with GenericEnvClient(base_url=server).sync() as client:
        drawn = {client.reset().observation["task_id"] for _ in range(12)}
    assert len(drawn) > 1  # 8 served tasks: 12 draws all alike has odds 8 ** -11
    receipt = ToolReceipt(tool="python", arguments={"code": "print(1)"}, decision="allowed",
                          status="ok")
    as_json = {"receipt": dataclasses.asdict(receipt), "turn": 1}
    assert _jsonable({"receipt": receipt, "turn": 1}) == as_json
