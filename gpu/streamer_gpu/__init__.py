"""GPU kernels (numba-CUDA) and the device memory arena; an install extra (`streamer[gpu]`).

Only `open_gpu` touches CUDA, and only when asked: the base install, and machines without a
GPU, never need numba-cuda.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from streamer_gpu.options import AbeaBatchStats, CudaOptions, HmmBatchStats

if TYPE_CHECKING:
    from streamer_gpu.abea import CudaAbea
    from streamer_gpu.hmm import CudaHmm

__all__ = ["AbeaBatchStats", "CudaOptions", "HmmBatchStats", "open_gpu", "open_gpu_hmm"]

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
    from streamer_gpu.abea import CUDA_ERRORS, CudaAbea

    try:
        return CudaAbea(options, bandwidth)
    except CUDA_ERRORS as exc:
        log.warning("could not start ABEA on GPU %d (%s): ABEA runs on the CPU", options.dev_id, exc)
        return None


def open_gpu_hmm(options: CudaOptions) -> CudaHmm | None:
    """The GPU CpG HMM on options.dev_id, or None, said in one log line, when there is none to use."""
    if options.disable or not options.hmm:
        return None
    try:
        from numba import cuda
    except ImportError as exc:
        log.info("no CUDA support in this install (%s): the CpG HMM runs on the CPU", exc)
        return None
    if not cuda.is_available():
        log.info("no CUDA GPU found: the CpG HMM runs on the CPU")
        return None
    from streamer_gpu.abea import CUDA_ERRORS
    from streamer_gpu.hmm import CudaHmm

    try:
        return CudaHmm(options.dev_id)
    except CUDA_ERRORS as exc:
        log.warning("could not start the CpG HMM on GPU %d (%s): it runs on the CPU", options.dev_id, exc)
        return None
