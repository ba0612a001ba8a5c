"""How numba hands a parallel loop's iterations to its threads: a chunk size, set per launching thread.

numba's own `numba.parallel_chunksize` keeps the size it replaces on one object that every thread and
every nesting share, so a nested or concurrent use restores another's size: a pipeline's warm-up left
its thread at 1, and a loop of cheap iterations there went one iteration a task (the GPU HMM's job
packing 8 times slower than at its stage's size, on 2 cores). `chunked` keeps the size on the stack.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numba


@contextlib.contextmanager
def chunked(size: int) -> Iterator[None]:
    """Parallel loops launched from this thread inside the block hand out `size` iterations at a time
    (1 where iterations differ by orders of magnitude, as reads do; 0: an equal share a thread)."""
    replaced = numba.set_parallel_chunksize(size)
    try:
        yield
    finally:
        numba.set_parallel_chunksize(replaced)
