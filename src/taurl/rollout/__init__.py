"""Rollout: the agent loop, episode collection, demonstrations."""
