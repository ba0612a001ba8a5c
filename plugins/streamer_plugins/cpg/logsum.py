"""HMMER's table-driven log-sum (p7_FLogsum), as nanopolish and f5c use it in the profile HMM.

The forward algorithm must sum probabilities exactly as those tools do to reproduce their
log-likelihoods to the printed precision, so the sum is the same float32 table lookup, not
`np.logaddexp`: `log(e^a + e^b) = max + table[int((max - min) * 1000)]`, and just `max` when
the difference reaches 15.7 nats or one side is -inf. The error is below 0.001 nats per sum.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from streamer.pipeline.targets import CPU, Target

LOGSUM_TABLE_SIZE = 16000
LOGSUM_SCALE = 1000.0
LOGSUM_CUTOFF = 15.7


def make_logsum_table(size: int = LOGSUM_TABLE_SIZE, scale: float = LOGSUM_SCALE) -> np.ndarray:
    """float32 table of log(1 + e^(-i/scale)), each entry computed in double and then rounded."""
    x = -np.arange(size, dtype=np.float64) / np.float64(np.float32(scale))
    return np.log(1.0 + np.exp(x)).astype(np.float32)


LOGSUM_TABLE = make_logsum_table()


@functools.cache
def flogsum_for(t: Target) -> Callable:
    """`flogsum` compiled for target t (the CPU here; the device for the GPU HMM)."""
    fadd, fsub, fmul = t.fadd, t.fsub, t.fmul

    @t.jit
    def flogsum(a, b, table):
        """log(e^a + e^b) for float32 a, b (either may be -inf) through the lookup table."""
        hi = a if a > b else b
        lo = a if a < b else b
        d = fsub(hi, lo)  # inf or nan when lo is -inf: then the comparison below is false
        # a branch, not a select: in one window's forward pass the skip state's chain of log-sums
        # runs block to block, and a predicted branch lets the CPU run ahead where a select waits
        # (the pass took 1.5 times as long); on the GPU the table is then read only when needed, and
        # in the CPU's SIMD lanes it is a masked gather. The index (below 15,700) is a uint16: numba
        # adds no negative-index wraparound to it, and the lanes' gather takes 32-bit offsets, one
        # instruction for sixteen lanes where 64-bit ones take two (the lanes 10% faster)
        if d < np.float32(LOGSUM_CUTOFF):
            return fadd(hi, table[np.uint16(fmul(d, np.float32(LOGSUM_SCALE)))])
        return hi

    return flogsum


flogsum = flogsum_for(CPU)
