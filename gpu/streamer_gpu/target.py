"""CUDA as a compile target of the shared per-cell arithmetic (`streamer.pipeline.targets`), and its errors.

On a GPU the rounding operations are libdevice's round-to-nearest intrinsics, which the
compiler never contracts into fused multiply-adds, so every product and sum is rounded where
the CPU rounds it. numba's CUDA simulator has no libdevice: there they are the CPU's plain
numpy scalar operations (also IEEE round-to-nearest). Importing this module needs numba's CUDA
target but no GPU.
"""

from __future__ import annotations

from numba import config, cuda
from numba.cuda.cudadrv.driver import CudaAPIError, LinkerError
from numba.cuda.cudadrv.error import CudaSupportError

from streamer.pipeline import warmup
from streamer.pipeline.targets import IEEE_OPS, Target

warmup.gpu_kernels_too()  # a pipeline's command loads the cached kernels without the compiler's registries

SIMULATED = bool(config.ENABLE_CUDASIM)
# a failed launch, copy, allocation (device out of memory included) or module load: the work goes to the CPU
CUDA_ERRORS = (CudaAPIError, CudaSupportError, LinkerError)

if SIMULATED:
    _OPS = IEEE_OPS
else:
    from numba.cuda import libdevice

    _OPS = (libdevice.fadd_rn, libdevice.fsub_rn, libdevice.fmul_rn, libdevice.fdiv_rn, libdevice.dadd_rn,
            libdevice.dmul_rn, libdevice.ddiv_rn, libdevice.fsqrt_rn)  # fmt: skip

DEVICE = Target("cuda", cuda.jit(device=True), *_OPS)
