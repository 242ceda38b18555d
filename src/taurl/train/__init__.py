"""Training: objectives (pure losses, `taurl.train.objectives`), the learner, SFT, checkpoints.

Import the submodules you need; this package imports nothing on its own so that the
learner's modules and the objectives load independently.

``taurl.train(env, ...)`` — this package, called — is the public API's `taurl.api.train`: the
import system binds ``taurl.train`` to this package as soon as any of its modules loads, so
the package itself is the callable (one object, whichever way it was reached).
"""

import sys
import types
from typing import Any


class _TrainPackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from taurl.api import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _TrainPackage
