"""taurl: agentic RL on multi-turn, tool-using tasks.

    import taurl
    summary = taurl.train(MyEnv, tasks=tasks, reward=my_reward, run_dir="runs/mine", updates=20)

The public API (`taurl.api`): `train`, `evaluate`, `register` (an env and its plug points),
`Env` and `Task` (the env protocol and its task record), `TrainConfig` (every option).
They load on first use, so ``import taurl`` stays cheap (no torch, no transformers), and
importing it changes nothing in the process (no environment variable is set).

``taurl.train`` is the function `taurl.api.train`; the training package ``taurl/train/``
keeps its name and is imported as ever (``from taurl.train import learner``,
``import taurl.train.learner as learner``, ``taurl.train.learner`` once imported): see
`taurl.train`'s docstring for how both live under one name.
"""

import importlib as _importlib
import sys as _sys
import types as _types

__version__ = "0.1.0"

# name -> the module that defines it (imported on first access, PEP 562)
_API = {"train": "taurl.api", "evaluate": "taurl.api", "register": "taurl.envs.registry",
        "Env": "taurl.envs.core", "Task": "taurl.envs.core", "TrainConfig": "taurl.recipe.config"}
__all__ = ["Env", "Task", "TrainConfig", "__version__", "evaluate", "register", "train"]


def __getattr__(name: str) -> object:
    if name not in _API:
        raise AttributeError(f"module 'taurl' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_API[name]), name)
    if name == "train":  # the training package's submodules, through the function too
        _importlib.import_module("taurl.train").expose_submodules(value)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))


class _Taurl(_types.ModuleType):
    """The `taurl` module's type: its name ``train`` stays the API's function.

    The import system binds a subpackage onto its parent when it first loads it
    (``import taurl.train.learner`` sets ``taurl.train`` to the package), which would replace
    the function with the package; that one binding is skipped (the package stays in
    ``sys.modules``, where imports find it)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "train" and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Taurl
