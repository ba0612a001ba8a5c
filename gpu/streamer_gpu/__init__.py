"""GPU kernels (numba-CUDA), the device memory arena, and CUDA as a compile target; an install extra
(`streamer[gpu]`).

This package builds on the core (`streamer`) and never on the plugins: a plugin with GPU work
(the CpG HMM) keeps its kernel and compiles it with `streamer_gpu.target`. The core reaches this
package only through `streamer.gpu_api.gpu_module`, when a GPU stage is asked for. Only
`open_gpu` touches CUDA, and only when asked: the base install, and machines without a GPU,
never need numba-cuda.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from streamer.gpu_api import CudaOptions

if TYPE_CHECKING:
    from streamer_gpu.abea import CudaAbea

__all__ = ["open_gpu"]

log = logging.getLogger(__name__)


def open_gpu(options: CudaOptions, bandwidth: int = 100) -> CudaAbea | None:
    """The GPU ABEA stage on options.dev_id, or None, said in one log line, when there is none to use."""
    if options.disable:
        return None
    try:
        from numba import cuda
    except ImportError as exc:
        log.info("no CUDA support in this install (%s): ABEA runs on the CPU", exc)
        return None
    if not cuda.is_available():
        log.info("no CUDA GPU found: ABEA runs on the CPU")
        return None
    from streamer_gpu.abea import CudaAbea
    from streamer_gpu.target import CUDA_ERRORS

    try:
        return CudaAbea(options, bandwidth)
    except CUDA_ERRORS as exc:
        log.warning("could not start ABEA on GPU %d (%s): ABEA runs on the CPU", options.dev_id, exc)
        return None
