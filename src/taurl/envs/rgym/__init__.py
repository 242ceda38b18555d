"""reasoning-gym (the `reasoning-gym` package) as a taurl env: any task family by name.

    taurl train --env reasoning-gym --env-config '{"dataset": "letter_counting"}'

`tasks`: the family by name, its options, splits by content, the verifier and the expert;
`env`: the inline answer protocol and the optional sandboxed Python tool.
"""

from taurl.envs.rgym.env import ReasoningGymEnv, parse_action
from taurl.envs.rgym.tasks import RGVerifier, dataset_options, rg_expert, rg_tasks, score

__all__ = ["RGVerifier", "ReasoningGymEnv", "dataset_options", "parse_action", "rg_expert",
           "rg_tasks", "score"]
