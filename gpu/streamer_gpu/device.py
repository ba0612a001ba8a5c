"""Which GPU is there: name, memory, integrated or not; what device profiles and learned values key on.

Importable without numba-cuda; `probe_gpu` imports CUDA only when called, and answers None
where there is no GPU to use.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

log = logging.getLogger(__name__)
# the simulator reports unbounded memory: describe it as a small discrete device
SIMULATED_TOTAL_BYTES = 1 << 30


@dataclass(frozen=True)
class GpuInfo:
    name: str
    total_bytes: int
    free_bytes: int
    integrated: bool  # shares the host's memory (Jetson)

    @property
    def key(self) -> str:
        """Learned values are kept per device model and memory size: `NVIDIA H100 80GB HBM3 (81559 MiB)`."""
        return f"{self.name} ({self.total_bytes >> 20} MiB)"


def probe_gpu(dev_id: int = 0) -> GpuInfo | None:
    """GPU dev_id as the profiles need it, before the arena is taken; None without numba-cuda or a GPU."""
    try:
        from numba import cuda
    except ImportError:
        return None
    if not cuda.is_available():
        return None
    from streamer_gpu.abea import CUDA_ERRORS

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
    return GpuInfo(name, int(total), int(free), bool(getattr(device, "INTEGRATED", 0)))
