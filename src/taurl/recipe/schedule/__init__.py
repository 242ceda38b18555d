"""Schedules of the RL phase: ``schedule: sync`` lives in `taurl.recipe.loop`; ``schedule: async``
(rollouts ahead of the learner, staleness bounded by η) in `taurl.recipe.schedule.async_rl`, with
its admission rule and consumption check in `taurl.recipe.schedule.admission`."""

from taurl.recipe.schedule.admission import capacity, episode_age, split_fresh, staleness_stats

__all__ = ["capacity", "episode_age", "split_fresh", "staleness_stats"]
