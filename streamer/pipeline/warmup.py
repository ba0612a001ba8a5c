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
from pathlib import Path

FIRST_COMPILE_S = 60  # measured 62 s on 2 cores (the CPU HMM's lanes take about 20 s of it); the README quotes it (tests/test_first_run.py holds it to this)
COMMANDS = ("call", "eventalign", "run")  # the commands that build a pipeline, so compile on a first run


def kernels_cached(env: dict[str, str] | None = None) -> bool:
    """Whether numba's cache has an index for ABEA, the kernel every pipeline runs: in
    `NUMBA_CACHE_DIR` (numba keeps a folder per source folder there) or beside the sources.

    Looked for by name, without importing numba (a second of the first two), so the notice
    comes before the imports; a cache left by an older version of the source is counted as there.
    """
    env = os.environ if env is None else env
    root = env.get("NUMBA_CACHE_DIR")
    where = [Path(root)] if root else [Path(__file__).parent / "__pycache__"]
    return any(next(folder.rglob(INDEX), None) is not None for folder in where if folder.is_dir())


INDEX = "abea.abea-*.nbi"  # numba's index file of `streamer.pipeline.abea.abea`


def announce_compile(log: logging.Logger) -> bool:
    """Say that kernels are being compiled, when they are; True when they are."""
    if kernels_cached():
        return False
    log.info("compiling kernels for this machine (first run only, about %d s on 2 cores)", FIRST_COMPILE_S)
    return True
