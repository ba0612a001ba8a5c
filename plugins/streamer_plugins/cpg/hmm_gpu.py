"""Opening the GPU CpG HMM where there is a GPU to use.

Importable without numba-cuda or a GPU: the kernel and its launcher (`streamer_plugins.cpg.hmm_cuda`)
are imported only when a GPU is there; what both sides share (the jobs) is in `hmm_jobs`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from streamer.pipeline.gpu import CudaOptions
from streamer_gpu import gpu_absent

if TYPE_CHECKING:
    from streamer_plugins.cpg.hmm_cuda import CudaHmm

log = logging.getLogger(__name__)


def open_gpu_hmm(options: CudaOptions) -> CudaHmm | None:
    """The GPU CpG HMM on options.dev_id, or None, said in one log line, when there is none to use."""
    if options.disable or not options.hmm or gpu_absent("the CpG HMM"):
        return None
    from streamer_gpu.target import CUDA_ERRORS
    from streamer_plugins.cpg.hmm_cuda import CudaHmm

    try:
        return CudaHmm(options.dev_id, stream_priority=options.stream_priority)
    except CUDA_ERRORS as exc:
        log.warning("could not start the CpG HMM on GPU %d (%s): it runs on the CPU", options.dev_id, exc)
        return None
