"""The engine: token in, token out (a façade over the modules that hold it).

The contract (`Engine`, `SamplingParams`, `Generation`) is in `taurl.policy.protocol`; the
in-process continuous-batching engine in `taurl.policy.local_engine` (its worker thread in
`taurl.policy.engine_worker`, next-token sampling in `taurl.policy.sampling`, the prefix
cache in `taurl.policy.prefix_cache`); `make_engine` in `taurl.policy.factory`. Every name
stays importable from here.
"""

from taurl.policy.engine_worker import PREFILL_PAD_WASTE
from taurl.policy.factory import make_engine
from taurl.policy.local_engine import LocalEngine
from taurl.policy.prefix_cache import PrefixCache
from taurl.policy.protocol import (
                                   PAUSE_MODES,
                                   Engine,
                                   EngineHealth,
                                   Generation,
                                   Generator,
                                   SamplingParams,
                                   check_pause_mode,
)
from taurl.policy.sampling import sample_tokens

__all__ = ["PAUSE_MODES", "PREFILL_PAD_WASTE", "Engine", "EngineHealth", "Generation",
           "Generator", "LocalEngine", "PrefixCache", "SamplingParams", "check_pause_mode",
           "make_engine", "sample_tokens"]
