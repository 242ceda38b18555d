"""taurl: agentic RL on multi-turn, tool-using tasks."""

import os

# OpenMP workers that spin while waiting collapse torch's CPU throughput when cores are
# shared (measured here: the engine fell 2.5x on 2 busy cores). Passive waiting is the
# default unless the user chose otherwise; it only takes effect if torch is not yet loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
