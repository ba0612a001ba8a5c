"""The kernels' first compile on a machine: whether numba's cache holds them, and the one line that
tells a user why the first run waits.

numba compiles every kernel for the CPU it runs on and caches the result (beside the sources, in
`NUMBA_CACHE_DIR`, or in the user's cache folder for a read-only install); the first run on a
machine, or after an upgrade, compiles for tens of seconds before the first batch. Commands
announce it before they start, and report the time as start-up, not as the speed of a stage.
"""

from __future__ import annotations

import logging
import os

FIRST_COMPILE_S = 40  # on 2 cores of a 2020s x86 machine: 30 to 70 s (README, "Correctness and speed")


def kernels_cached() -> bool:
    """Whether numba's cache has compiled ABEA, the kernel every command runs (True when numba's
    cache layout is not the one this reads: no notice rather than a wrong one)."""
    from streamer.abea import abea

    try:
        return os.path.exists(abea._cache._cache_file._index_path)
    except AttributeError:
        return True


def announce_compile(log: logging.Logger) -> bool:
    """Say that kernels are being compiled, when they are; True when they are."""
    if kernels_cached():
        return False
    log.info("compiling kernels for this machine (first run only, about %d s)", FIRST_COMPILE_S)
    return True
