"""The kernels' first compile on a machine: whether numba's cache holds them, the one line that
tells a user why the first run waits, and how every later run loads them.

numba compiles every kernel for the CPU it runs on and caches the result (beside the sources, in
`NUMBA_CACHE_DIR`, or in the user's cache folder for a read-only install); the first run on a
machine, or after an upgrade, compiles for tens of seconds before the first batch. Commands
announce it before they start, and report the time as start-up, not as the speed of a stage.

Before it loads a cached kernel, numba refreshes the target's registries: it imports every typing
and lowering implementation the compiler has (numba-cuda's half-precision types alone are thousands),
though a loaded kernel is machine code that uses none of them. That is about a third of a second a
target on a GPU box, the CPU's and the GPU's in turn, holding the GIL at the head of every run.
`load_without_registries` lets a pipeline's command load its cached kernels without them; a compile
still refreshes them first, as it always does (`numba.core.compiler.CompilerBase`).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

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


def load_without_registries() -> None:
    """This process's cached CPU kernels loaded without their target's registries from now on, and its
    GPU kernels too once the GPU package loads (`gpu_kernels_too`); idempotent."""
    from numba.core import caching

    _skip_refresh(caching.Cache)


def gpu_kernels_too() -> None:
    """Where this process loads its CPU kernels without the registries, its GPU kernels too: numba-cuda's
    own cache (where it has one), extended as the GPU package imports numba-cuda, not before: imported by the
    CLI, numba-cuda held its imports 0.1-0.35 s longer on a GPU box, where the GPU probe's thread imports it
    beside the plan (`benchmarks/RESULTS-cpu-half.md`)."""
    from numba.core import caching

    if not getattr(caching.Cache.load_overload, "skips_refresh", False):
        return
    try:
        from numba.cuda.core import caching as cuda_caching
    except ImportError:  # a numba-cuda that loads through numba's own cache, or the simulator's
        return
    _skip_refresh(cuda_caching.Cache)


def _skip_refresh(cache: type) -> None:
    load = cache.load_overload
    if getattr(load, "skips_refresh", False):
        return

    @functools.wraps(load)
    def load_overload(self: Any, sig: Any, target_context: Any) -> Any:
        own = getattr(target_context, "__dict__", None)
        if own is None or "refresh" in own or not callable(getattr(target_context, "refresh", None)):
            return load(self, sig, target_context)  # a context this does not know: numba's own way
        # under numba's compiler lock, as every load and compile of a dispatcher is: no compile of this
        # target runs meanwhile to find its refresh gone
        _ready_to_link(target_context)
        target_context.refresh = _nothing
        try:
            return load(self, sig, target_context)
        finally:
            del target_context.refresh

    load_overload.skips_refresh = True  # type: ignore[attr-defined]
    cache.load_overload = load_overload


def _ready_to_link(target_context: Any) -> None:
    """What a CPU kernel's machine code links against that the registries' refresh would have set up:
    numba's runtime (its allocator's symbols), set up once."""
    from numba.core.cpu import CPUContext
    from numba.core.runtime import rtsys

    if isinstance(target_context, CPUContext):
        rtsys.initialize(target_context)


def _nothing() -> None:
    pass
