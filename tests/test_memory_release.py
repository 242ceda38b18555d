"""`taurl.monitor.memory.release_free_memory`: freed heap memory the C allocator kept goes back
to the OS (the RL loop calls it at each phase boundary, so a phase's peak is its own)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from taurl.monitor.memory import release_free_memory

# In a child process: a clean heap, nothing else allocating. 50,000 chunks of 4 kB (above
# pymalloc's 512 B, below glibc's mmap threshold) fill ~200 MB of heap; one more, allocated
# after them, keeps the heap's top in place, so freeing them does not shrink it by itself.
CHILD = """
import gc, json, sys
from taurl.monitor.memory import current_rss_mb, release_free_memory
base = current_rss_mb()
blocks = [bytearray(4000) for _ in range(50_000)]
pin = bytearray(4000)
del blocks
gc.collect()
held = current_rss_mb()
released = release_free_memory() if sys.argv[1] == "release" else False
print(json.dumps({"base": base, "held": held, "after": current_rss_mb(), "released": released}))
"""


def _child(mode: str) -> dict:
    import json

    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_freed_heap_memory_goes_back_to_the_os():
    if not release_free_memory():
        pytest.skip("no glibc malloc_trim on this platform: release_free_memory is a no-op here")
    kept, released = _child("keep"), _child("release")
    assert kept["after"] - kept["base"] > 150  # freed, yet resident: the allocator keeps it (MB)
    assert released["released"] and released["held"] - released["base"] > 150
    assert released["after"] - released["base"] < 50  # given back
