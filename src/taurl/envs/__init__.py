"""Environments: the protocol, the registry, the checker and the built-in envs."""

from taurl.envs.checker import check_env
from taurl.envs.core import Env, Task, close_env
from taurl.envs.registry import import_env_modules, make, make_tasks, register, registered, spec

# "module:attr" references are imported on first use (Gymnasium's entry points), so
# `import taurl` loads no env's dependencies
register("search-v0", "taurl.envs.search:SearchEnv", tasks="taurl.envs.search:generate_tasks",
         expert="taurl.envs.search.expert:search_expert",
         verifier="taurl.envs.search.verifier:SearchVerifier",
         policy_hooks="taurl.envs.search.hooks:SearchPolicyHooks",
         tool_expert="taurl.envs.search.expert:search_tool_expert")
register("code-v0", "taurl.envs.code:CodeEnv", tasks="taurl.envs.code:generate_tasks",
         expert="taurl.envs.code:expert", verifier="taurl.envs.code:make_holdout_verifier",
         policy_hooks="taurl.envs.code.hooks:CodePolicyHooks")
register("frozenlake-v0", "taurl.envs.gym.frozenlake:frozenlake_env",
         tasks="taurl.envs.gym.frozenlake:frozenlake_tasks",
         expert="taurl.envs.gym.frozenlake:frozenlake_expert",
         verifier="taurl.envs.gym.frozenlake:frozenlake_verifier")
register("taxi-v0", "taurl.envs.gym.taxi:taxi_env", tasks="taurl.envs.gym.taxi:taxi_tasks",
         expert="taurl.envs.gym.taxi:taxi_expert", verifier="taurl.envs.gym.taxi:taxi_verifier")
# two roles: the policy against a scripted opponent; self-play through taurl.rollout.match
register("tictactoe-v0", "taurl.envs.games.tictactoe:tictactoe_env",
         tasks="taurl.envs.games.tictactoe:tictactoe_tasks",
         expert="taurl.envs.games.tictactoe:tictactoe_expert",
         verifier="taurl.envs.games.tictactoe:TicTacToeVerifier")
register("mcp-v0", "taurl.envs.mcp.env:MCPEnv", tasks="taurl.envs.mcp:generate_tasks",
         expert="taurl.envs.mcp:expert", verifier="taurl.envs.mcp:SubmissionVerifier")
# the field's environment standards (docs/envs.md), each needing its package ('taurl[ecosystem]')
register("reasoning-gym", "taurl.envs.rgym.env:ReasoningGymEnv",
         tasks="taurl.envs.rgym.tasks:rg_tasks",
         expert="taurl.envs.rgym.tasks:rg_expert", verifier="taurl.envs.rgym.tasks:RGVerifier")
register("openenv", "taurl.envs.openenv_bridge:OpenEnvEnv",
         tasks="taurl.envs.openenv_bridge:openenv_tasks",
         verifier="taurl.envs.openenv_bridge:OpenEnvVerifier")
register("textarena", "taurl.envs.textarena_bridge:TextArenaEnv",
         tasks="taurl.envs.textarena_bridge:textarena_tasks",
         expert="taurl.envs.textarena_bridge:textarena_expert",
         verifier="taurl.envs.textarena_bridge:TextArenaVerifier")
register("verifiers", "taurl.envs.verifiers_bridge:VerifiersEnv",
         tasks="taurl.envs.verifiers_bridge:verifiers_tasks",
         verifier="taurl.envs.verifiers_bridge:VerifiersVerifier")

__all__ = ["Env", "Task", "check_env", "close_env", "import_env_modules", "make", "make_tasks",
           "register", "registered", "spec"]
