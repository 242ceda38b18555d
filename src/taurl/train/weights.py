"""Save and restore one module's weights as safetensors (the critic's, the step scorer's).

Both sit inside a policy checkpoint and belong to the policy they were trained with, so a
restore that does not fit the module raises an error saying so instead of loading half.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from taurl.errors import Error


def save_weights(module: torch.nn.Module, path: str | Path) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}, str(path))


def load_weights(module: torch.nn.Module, path: str | Path, what: str) -> None:
    """Load `path` into `module` on its device; `what` names it in the error ("the critic in
    DIR")."""
    state = load_file(str(path))
    device = next(module.parameters()).device
    missing, unexpected = module.load_state_dict({k: v.to(device) for k, v in state.items()},
                                                 strict=False)
    if missing or unexpected:
        raise Error(f"{what} does not fit this policy (missing {missing[:3]}, unexpected "
                    f"{unexpected[:3]}); resume with the model it was trained with")
