"""Compile targets of the per-cell arithmetic that the CPU and GPU kernels share.

The ABEA cell, the CpG HMM's forward pass, event detection and the Gaussian log-density are each
written once, as plain Python in a factory that takes a `Target` and compiles them with its `jit`
(numba `njit` here, `cuda.jit(device=True)` in `streamer_gpu.target`), calling the target's
rounding operations for every float operation whose rounding matters. On the CPU those are
plain IEEE float32/float64 operations; CUDA would contract a multiply and an add into one
fused multiply-add that rounds once, so there they are libdevice's round-to-nearest
intrinsics, which are never fused. The same source, the same operations in the same order:
the two targets agree to the bit. numba's on-disk cache is checked against the kernel's own file
only: after editing a shared helper (here, `abea_cells.py`, `event_cells.py`, `cpg/hmm_cells.py`,
`cpg/logsum.py`), delete the `*.nbi`/`*.nbc` files so the kernels that inline it are compiled again.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import numba
import numpy as np


class Target(NamedTuple):
    """How to compile a shared helper, and the rounding operations its source calls."""

    name: str
    jit: Callable[[Callable], Callable]
    fadd: Callable  # float32 a + b, rounded to nearest
    fsub: Callable
    fmul: Callable
    fdiv: Callable
    dadd: Callable  # float64
    dmul: Callable
    ddiv: Callable
    fsqrt: Callable  # float32 square root, rounded to nearest


def fadd(a, b):
    return np.float32(a) + np.float32(b)


def fsub(a, b):
    return np.float32(a) - np.float32(b)


def fmul(a, b):
    return np.float32(a) * np.float32(b)


def fdiv(a, b):
    return np.float32(a) / np.float32(b)


def dadd(a, b):
    return np.float64(a) + np.float64(b)


def dmul(a, b):
    return np.float64(a) * np.float64(b)


def ddiv(a, b):
    return np.float64(a) / np.float64(b)


def fsqrt(a):
    return np.float32(math.sqrt(np.float32(a)))


# plain IEEE operations: numba's CPU code and numpy scalars (the CUDA simulator) never contract them
IEEE_OPS = (fadd, fsub, fmul, fdiv, dadd, dmul, ddiv, fsqrt)

# numpy's error model: a division by zero gives inf or nan, as in C and on the GPU, instead of
# Python's ZeroDivisionError, whose test on every division keeps LLVM from vectorising a loop
_cpu_jit = numba.njit(nogil=True, cache=True, error_model="numpy")
CPU = Target("cpu", _cpu_jit, *(_cpu_jit(op) for op in IEEE_OPS))
# the CPU's, each helper compiled into its caller (numba's inline="always"): LLVM turns a loop over
# SIMD lanes into vector code only when the helpers it calls are part of the loop's own function
LANE = CPU._replace(name="lane", jit=numba.njit(nogil=True, error_model="numpy", inline="always"))


F5C_LOG_INV_SQRT_2PI = np.float32(-0.918938)  # f5c's literal for ln(1/sqrt(2 pi))
NANOPOLISH_LOG_INV_SQRT_2PI = np.float32(math.log(0.3989422804014327))  # nanopolish's, computed in double


@functools.cache
def log_normal_pdf(t: Target, log_inv_sqrt_2pi: float = F5C_LOG_INV_SQRT_2PI) -> Callable:
    """ln N(x; mean, stdv) in float32 for target t, with f5c's -0.918938 for ln(1/sqrt(2 pi)) unless told.

    ABEA (unscaled stdv) and the methylation HMM (stdv scaled by the read's var) both use it:
    (-0.918938 - log stdv) + (-0.5 a) a with a = (x - mean) / stdv, as f5c and nanopolish order it;
    nanopolish's own constant (`NANOPOLISH_LOG_INV_SQRT_2PI`) is 9 float32 steps away.
    """
    fadd, fsub, fmul, fdiv = t.fadd, t.fsub, t.fmul, t.fdiv
    log_c = np.float32(log_inv_sqrt_2pi)

    @t.jit
    def log_normal_pdf(x, mean, stdv, log_stdv):
        a = fdiv(fsub(x, mean), stdv)
        return fadd(fsub(log_c, log_stdv), fmul(fmul(np.float32(-0.5), a), a))

    return log_normal_pdf
