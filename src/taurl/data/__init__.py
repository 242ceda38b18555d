"""Data at rest: trajectories, the ledger, the export format, the run directory, atomic writes."""
