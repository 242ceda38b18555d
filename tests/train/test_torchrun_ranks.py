"""Your own launcher: ranks started by ``torchrun`` serve taurl's driver (docs/scale-out.md).

The documented path, as a user runs it: the driver with TAURL_DIST_LAUNCH=external waits at
TAURL_DIST_ADDR for `world_size` ranks; ``torchrun --standalone --nproc-per-node 2 -m
taurl.train.distributed.worker`` starts them with RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT of its own, the same two TAURL_ variables and TAURL_DIST_WAIT_S.
The ranks take the step of one process on the tiny policy's batches, then exit by
themselves once no driver has come back for TAURL_DIST_WAIT_S seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_distributed_learner import _batches
from test_learner_invalid import _model

from taurl.train.distributed.equivalence import run_pair
from taurl.train.distributed.group import free_port
from taurl.train.learner import LearnerConfig

TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))


@pytest.mark.skipif(not os.access(TORCHRUN, os.X_OK), reason="torchrun is not installed")
def test_ranks_started_by_torchrun_take_the_step_of_one_process(monkeypatch):
    key, port = os.urandom(16).hex(), free_port()
    env = {"TAURL_DIST_ADDR": f"127.0.0.1:{port}", "TAURL_DIST_KEY": key}
    src = str(Path(__file__).resolve().parents[2] / "src")
    ranks = subprocess.Popen(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "taurl.train.distributed.worker"],
        env={**os.environ, **env, "TAURL_DIST_DEVICE": "cpu", "TAURL_DIST_WAIT_S": "5",
             "OMP_NUM_THREADS": "1",
             "PYTHONPATH": os.pathsep.join(filter(None, (src, os.environ.get("PYTHONPATH"))))})
    try:
        for k, v in {**env, "TAURL_DIST_LAUNCH": "external"}.items():
            monkeypatch.setenv(k, v)
        model = _model()
        config = LearnerConfig(lr=1e-2, micro_batch_tokens=40)
        pair = run_pair(model, config, _batches(model)[:3], strategy="ddp", world_size=2)
        pair.two.close()  # the driver leaves; the ranks wait TAURL_DIST_WAIT_S for another
        rel = pair.relative()
        assert rel["learn/loss"] <= 1e-5 and rel["learn/grad_norm"] <= 1e-5, rel
        assert pair.weight_difference() < 1e-2 * config.lr
        assert all(g["learn/ranks"] == 2.0 for g in pair.got)
        assert ranks.wait(120) == 0  # no driver came back: both ranks left the group and exited
    finally:
        if ranks.poll() is None:
            ranks.kill()
            ranks.wait()
