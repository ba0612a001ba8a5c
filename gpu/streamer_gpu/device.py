"""Which GPU is there (`streamer.pipeline.gpu.GpuInfo`): name, memory, integrated or not.

Importable without numba-cuda; `probe_gpu` imports CUDA only when called, and answers None
where there is no GPU to use.
"""

from __future__ import annotations

import logging
import math

from streamer.pipeline.gpu import GpuInfo

log = logging.getLogger(__name__)
# the simulator reports unbounded memory: describe it as a small discrete device
SIMULATED_TOTAL_BYTES = 1 << 30


def probe_gpu(dev_id: int = 0) -> GpuInfo | None:
    """GPU dev_id as the profiles need it, before the arena is taken; None without numba-cuda or a GPU."""
    try:
        from numba import cuda
    except ImportError:
        return None
    if not cuda.is_available():
        return None
    from streamer_gpu.target import CUDA_ERRORS

    try:
        cuda.select_device(dev_id)
        device = cuda.current_context().device
        free, total = cuda.current_context().get_memory_info()
    except CUDA_ERRORS as exc:
        log.warning("could not query GPU %d (%s)", dev_id, exc)
        return None
    name = getattr(device, "name", "CUDA simulator")
    name = name.decode() if isinstance(name, bytes) else str(name)
    if not math.isfinite(total):
        free = total = SIMULATED_TOTAL_BYTES
    return GpuInfo(name, int(total), int(free), bool(getattr(device, "INTEGRATED", 0)), resident_threads(device))


def resident_threads(device) -> int:
    """Threads a device holds at once (0 where it does not say: the simulator).

    The attribute is spelt MAX_THREADS_PER_MULTIPROCESSOR where numba-cuda binds the driver through
    cuda-python, and MAX_THREADS_PER_MULTI_PROCESSOR in numba's own ctypes binding: either is taken.
    """
    per_sm = 0
    for name in ("MAX_THREADS_PER_MULTIPROCESSOR", "MAX_THREADS_PER_MULTI_PROCESSOR"):
        try:
            per_sm = int(getattr(device, name))
            break
        except AttributeError:
            continue
    return int(getattr(device, "MULTIPROCESSOR_COUNT", 0)) * per_sm
