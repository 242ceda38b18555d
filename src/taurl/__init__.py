"""taurl: agentic RL on multi-turn, tool-using tasks.

    import taurl
    summary = taurl.train(MyEnv, tasks=tasks, reward=my_reward, run_dir="runs/mine", updates=20)

The public API (`taurl.api`): `train`, `evaluate`, `register` (an env and its plug points),
`Env` and `Task` (the env protocol and its task record), `TrainConfig` (every option).
They load on first use, so ``import taurl`` stays cheap (no torch, no transformers).
"""

import importlib
import os
from typing import Any

# OpenMP workers that spin while waiting collapse torch's CPU throughput when cores are
# shared (measured here: the engine fell 2.5x on 2 busy cores). Passive waiting is the
# default unless the user chose otherwise; it only takes effect if torch is not yet loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

# name -> the module that defines it (imported on first access, PEP 562)
_API = {"train": "taurl.train", "evaluate": "taurl.api", "register": "taurl.envs.registry",
        "Env": "taurl.envs.core", "Task": "taurl.envs.core", "TrainConfig": "taurl.recipe.config"}
__all__ = ["Env", "Task", "TrainConfig", "__version__", "evaluate", "register", "train"]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'taurl' has no attribute {name!r}")
    module = importlib.import_module(_API[name])
    # `taurl.train` is the training package, callable as the API's `train` (taurl/train/__init__.py):
    # the import system binds the package to this name whenever one of its modules loads
    value = module if name == "train" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
