"""Gymnasium envs with discrete actions as taurl text envs (`adapter`), and two of them:
frozenlake-v0 (`frozenlake`) and taxi-v0 (`taxi`), each with a task source whose splits are
disjoint by world content (`splits`), an optimal expert with a quality knob and a replay
verifier (`solve`)."""

from taurl.envs.gym.adapter import GymGame, GymTextEnv, action_text, parse_action
from taurl.envs.gym.frozenlake import (
           FrozenLake,
           frozenlake_env,
           frozenlake_expert,
           frozenlake_tasks,
           frozenlake_verifier,
)
from taurl.envs.gym.solve import ReplayVerifier, expert_moves, goal_distances
from taurl.envs.gym.taxi import Taxi, taxi_env, taxi_expert, taxi_tasks, taxi_verifier

__all__ = ["FrozenLake", "GymGame", "GymTextEnv", "ReplayVerifier", "action_text", "expert_moves",
           "frozenlake_env", "frozenlake_expert", "frozenlake_tasks", "frozenlake_verifier",
           "goal_distances",
           "parse_action", "Taxi", "taxi_env", "taxi_expert", "taxi_tasks", "taxi_verifier"]
