"""The `taurl` namespace: `taurl.train` is the API's function (its signature, its docstring),
the training package stays importable every usual way, whichever loads first, and
``import taurl`` changes nothing in the process environment.

Each check runs in a fresh interpreter: what is bound on `taurl` depends on import order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def run(code: str, env: dict[str, str] | None = None) -> str:
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**base, "PYTHONPATH": str(SRC), **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_taurl_train_is_the_function_with_its_signature_and_docstring():
    out = run("""
import inspect, io, contextlib, taurl, taurl.api
from taurl import train
assert train is taurl.train is taurl.api.train and inspect.isfunction(train)
params = list(inspect.signature(taurl.train).parameters)
assert params[:2] == ["env", "tasks"] and "run_dir" in params and "reward" in params, params
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    help(taurl.train)
text = buf.getvalue()
assert "Train a policy on `env`" in text and "Training: objectives" not in text, text[:300]
print("ok")
""")
    assert out.strip() == "ok"


def test_the_training_package_is_importable_every_way_in_either_order():
    checks = """
import unittest.mock
assert taurl.train is taurl.api.train, taurl.train
from taurl.train import checkpoint
import taurl.train.objectives
assert ck is checkpoint and taurl.train.checkpoint is checkpoint
assert taurl.train.objectives is sys.modules["taurl.train.objectives"]
with unittest.mock.patch("taurl.train.checkpoint.save_policy") as fake:
    assert checkpoint.save_policy is fake
print("ok")
"""
    function_first = ("import sys, taurl, taurl.api; taurl.train\n"
                      "import taurl.train.checkpoint as ck")
    package_first = "import sys\nimport taurl.train.checkpoint as ck\nimport taurl, taurl.api"
    for first in (function_first, package_first):
        assert run(first + checks).strip() == "ok"


def test_import_taurl_sets_no_environment_variable_and_names_only_its_api():
    out = run("""
import os
before = dict(os.environ)
import taurl
assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())
public = {n for n in dir(taurl) if not n.startswith("_")}
assert public == set(taurl.__all__) - {"__version__"}, public
assert not {"Any", "os", "importlib"} & set(vars(taurl)), sorted(vars(taurl))
from taurl.cli.main import main
main([])  # the command sets it (passive OpenMP waits), not the import
assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
print("ok")
""")
    assert out.strip().endswith("ok")
