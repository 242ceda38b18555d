"""Metrics (namespaced keys, see `GLOSSARY`), progress and reports."""

from taurl.monitor.metrics import GLOSSARY, MetricsWriter, rollout_metrics

__all__ = ["GLOSSARY", "MetricsWriter", "rollout_metrics"]
