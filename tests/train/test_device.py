"""The device path (`taurl.policy.device`): ``device: auto | cpu | cuda[:n]`` and ``torch_dtype``.

Every test runs on the CPU; the CUDA ones run where a CUDA device is present and are skipped,
saying so, elsewhere. What is checked: the options are validated with how to fix them; the KL
reference, the critic and every tensor an update makes follow the policy's device; and no
tensor factory in the learner's path makes a tensor without a device (a source scan)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from tests.train._tiny_lm import tiny_lm

from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn
from taurl.errors import ConfigError
from taurl.policy.device import resolve_device, resolve_dtype
from taurl.policy.logprobs import sequence_logprobs
from taurl.recipe.config import TrainConfig
from taurl.recipe.validate import load_config
from taurl.train import learner as learner_module
from taurl.train.learner import Learner, LearnerConfig

CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device on this machine "
    "(torch.cuda.is_available() is False): the CUDA variant runs where there is one",
)
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
SRC = Path(__file__).resolve().parents[2] / "src" / "taurl"


def _traj(model, name, prompt, action, reward, group="g"):
    lp = sequence_logprobs(model, prompt + action)[len(prompt):].tolist()
    return Trajectory(
        episode_id=name,
        run_id="r",
        task_id=group,
        group_id=group,
        split="train",
        env_name="toy-v0",
        env_version="0",
        seed=0,
        segments=(Segment("prompt", tuple(prompt)), Segment("action", tuple(action), tuple(lp), 0)),
        turns=(Turn(0, "a", {"kind": "answer"}, "", 1, None, "eos"),),
        messages=({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}),
        terminated=True,
        truncated=False,
        stop_reason=StopReason.ANSWERED,
        reward=reward,
    )


def _batch(model):
    return [
        _traj(model, "a", [5, 6, 7], [10, 11, 12, 13], 1.0),
        _traj(model, "b", [5, 6, 7], [20, 21, 22], 0.0),
        _traj(model, "c", [5, 8, 7], [30, 31], 1.0, "h"),
        _traj(model, "d", [5, 8, 7], [40, 41, 42], 0.0, "h"),
    ]


def test_device_and_dtype_are_validated_saying_how_to_fix_them():
    def problems(**kw):
        with pytest.raises(ConfigError) as e:
            load_config(TrainConfig, data=kw)
        return str(e.value)

    assert "device must be auto, cpu, cuda or cuda:N (got 'tpu')" in problems(device="tpu")
    assert "torch_dtype must be one of float32, bfloat16 (got 'float16')" in problems(
        torch_dtype="float16"
    )
    if not torch.cuda.is_available():
        assert "no CUDA device is available here" in problems(device="cuda:0")
    else:
        assert f"this machine has {torch.cuda.device_count()} CUDA device(s)" in problems(
            device="cuda:99"
        )
    cfg = load_config(TrainConfig, data={"device": "cpu", "torch_dtype": "bfloat16"})
    assert (resolve_device(cfg.device), resolve_dtype(cfg.torch_dtype)) == (
        torch.device("cpu"),
        torch.bfloat16,
    )
    assert TrainConfig().device == "auto" and TrainConfig().torch_dtype == "float32"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_the_kl_reference_follows_the_policy_wherever_it_was_loaded():
    """Before: a policy moved by the caller and a reference left elsewhere met in the KL term
    (a device mismatch). The learner puts the reference on the policy's device (recorded here;
    on a CUDA machine the test below checks the parameters' device itself)."""
    model = tiny_lm(64, max_positions=64)
    reference = copy.deepcopy(model)
    moved, real_to = [], reference.to

    def to(*args, **kwargs):
        moved.append(args[0] if args else kwargs.get("device"))
        return real_to(*args, **kwargs)

    reference.to = to
    learner = Learner(model, LearnerConfig(lr=1e-2, kl_coef=0.1), reference=reference)
    assert moved == [torch.device("cpu")]
    assert {p.device.type for p in learner.reference.parameters()} == {"cpu"}
    m = learner.update(_batch(model))
    assert m["learn/kl_k3"] >= 0.0 and not m.get("learn/skipped")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_tensor_of_an_update_is_made_on_the_policy_device(device, dtype, monkeypatch):
    """An update with the KL reference and the critic (estimator gae), the policy placed with
    an explicit device and dtype: every row and mask is made there, and it learns."""
    model = tiny_lm(64, max_positions=64)
    batch = _batch(model)
    model.to(device=device, dtype=dtype)
    reference = copy.deepcopy(model).cpu().float()  # wherever: it follows the policy
    made = []
    real = learner_module.make_rows

    def make_rows(*args, **kwargs):
        rows = real(*args, **kwargs)
        made.extend(t.device for t in vars(rows).values() if isinstance(t, torch.Tensor))
        return rows

    monkeypatch.setattr(learner_module, "make_rows", make_rows)
    learner = Learner(
        model, LearnerConfig(lr=1e-2, kl_coef=0.1, estimator="gae"), reference=reference
    )
    before = [p.detach().clone() for p in model.parameters()]
    m = learner.update(batch)
    assert made and {d.type for d in made} == {torch.device(device).type}
    assert {p.device.type for p in learner.reference.parameters()} == {torch.device(device).type}
    assert {p.device.type for p in learner.critic.model.parameters()} == {torch.device(device).type}
    assert not m.get("learn/skipped") and any(
        not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)
    )


# every file of the learner's and the engine's path: a tensor factory there names its device,
# or the file builds on the host and moves the whole thing once (the reason, per file)
LEARNER_PATH = [
    "train/learner.py", "train/rows.py", "train/critic.py", "train/prm.py", "train/sft.py",
    "train/token_logprobs.py", "train/mismatch.py", "train/objectives/*.py", "policy/logprobs.py",
    "policy/logits.py", "policy/engine_worker.py", "policy/kv_cache.py", "policy/local_engine.py",
    "policy/sampling.py", "policy/slim_decode.py",
]
HOST_BUILT = {  # file -> the calls that build on the host, and where the result is moved
    "train/rows.py": "make_rows pads on the host and returns Rows(*(x.to(device) ...)) in one move",
    "train/critic.py": "_forward pads on the host and moves ids/attn/pos/last with .to(device); "
    "`norm` is a host placeholder overwritten by clip_grad_norm_",
    "policy/engine_worker.py": "the prefill pads on the host and moves ids/mask/positions "
    "with .to(self.device)",
    "policy/sampling.py": "each request's uniform draw comes from its own CPU generator (the same "
    "ids on any device), moved with .to(probs.device)",
}
FACTORY = re.compile(
    r"torch\.(tensor|zeros|ones|full|arange|empty|as_tensor|randn|rand|eye|linspace)\("
)


def _bare_calls(text: str) -> list[str]:
    """Each tensor-factory call (its whole argument list) that does not name a device."""
    out = []
    for m in FACTORY.finditer(text):
        depth, i = 0, m.end() - 1
        while True:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        call = text[m.start():i + 1]
        if "device" not in call and "_like" not in call:
            out.append(" ".join(call.split()))
    return out


def test_no_tensor_factory_in_the_learner_path_leaves_its_device_to_chance():
    files = sorted({p for pattern in LEARNER_PATH for p in SRC.glob(pattern)})
    assert len(files) >= 15
    bare = {str(p.relative_to(SRC)): calls for p in files if (calls := _bare_calls(p.read_text()))}
    unexplained = {f: c for f, c in bare.items() if f not in HOST_BUILT}
    assert not unexplained, (
        f"give these a device= (or move the result once, and say so in HOST_BUILT): {unexplained}"
    )
    assert set(HOST_BUILT) <= set(bare) | set(HOST_BUILT)

