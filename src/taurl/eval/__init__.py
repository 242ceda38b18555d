"""Evaluation: statistics, evaluation on a split, the promotion gate."""
