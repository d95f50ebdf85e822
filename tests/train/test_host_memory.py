"""Freed host memory goes back to the system between a step's phases."""

from __future__ import annotations

import os

import pytest

from agentrl.train.host_memory import _glibc, release_host_memory


def resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(_glibc() is None, reason="malloc_trim is glibc's; a no-op elsewhere")
def test_memory_freed_in_holes_of_the_heap_is_returned() -> None:
    # 100 KB blocks come from the heap (below glibc's mmap threshold); keeping every
    # tenth one alive leaves holes that glibc's own trimming (top of the heap) cannot give
    # back: the fragmentation a step's freed activations leave
    blocks = [bytearray(b"x" * 100_000) for _ in range(2_000)]
    kept = blocks[::10]
    del blocks
    before = resident_mb()
    assert release_host_memory()
    after = resident_mb()
    assert before - after > 100  # of the ~180 MB freed in holes
    assert len(kept) == 200
