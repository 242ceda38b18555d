"""Training: objectives (pure losses, `taurl.train.objectives`), the learner, SFT, checkpoints.

Import the submodules you need; this package imports nothing on its own so that the
learner's modules and the objectives load independently.

The name ``taurl.train`` is also the public API's function (`taurl.api.train`, which
``import taurl`` exports): on the `taurl` package the attribute ``train`` is that function,
and this package is reached through the import system, which finds it in ``sys.modules``
(``from taurl.train import learner``, ``from taurl.train.learner import Learner``). So that
dotted access reads the same as ever (``import taurl.train.learner as learner``,
``taurl.train.learner.Learner`` once imported, ``mock.patch("taurl.train.learner...")``),
each submodule, once loaded, is also an attribute of the function (`expose_submodules`).
The function is ``from taurl import train``: this package never imports the API above it
(not even lazily: the import-cycle check, tests/test_imports.py, counts that as an edge).
"""

import sys
import types

_API_MODULE = "taurl.api"


def _is_submodule(name: str, value: object) -> bool:
    return isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}"


def expose_submodules(fn: object) -> None:
    """Set each loaded submodule of this package as an attribute of `fn` (the API's
    `train`, when `taurl` binds it)."""
    for name, value in list(vars(sys.modules[__name__]).items()):
        if _is_submodule(name, value):
            setattr(fn, name, value)


class _TrainPackage(types.ModuleType):
    """This package's type: a submodule the import system binds here (as it loads it) is
    bound on the API's function too, once that is loaded (before: `expose_submodules`)."""

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        fn = getattr(sys.modules.get(_API_MODULE), "train", None)  # never imports it from here
        if fn is not None and _is_submodule(name, value):
            setattr(fn, name, value)


sys.modules[__name__].__class__ = _TrainPackage
