"""A stable least-significant-digit radix sort of (uint64 key, int64 value) pairs on the GPU.

4 bits a pass: each block counts the digits of its tile, the host turns the (digit, block) counts
into offsets (a few kilobytes), and each block scatters its tile, every thread its own run of
ITEMS pairs in order after the runs of the threads before it, so equal digits keep their order.
Passes whose digit every key shares are left out (the keys of one piece of the suffix sort share
their first symbols). The FM-index build sorts suffixes with it (`streamer_gpu.fmindex`).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from streamer_gpu.target import SIMULATED

# the simulator runs a Python thread per GPU thread: fewer, longer ones there (the same order, sooner)
THREADS = 32 if SIMULATED else 128
ITEMS = 64 if SIMULATED else 8
TILE = THREADS * ITEMS
DIGITS = 16


@functools.cache
def kernels():
    @cuda.jit
    def count_digits(keys, n, shift, counts):
        """counts[d * n_blocks + b]: keys of block b's tile whose digit at shift is d."""
        tally = cuda.shared.array(DIGITS, np.int32)
        t = cuda.threadIdx.x
        b = cuda.blockIdx.x
        if t < DIGITS:
            tally[t] = 0
        cuda.syncthreads()
        first = b * TILE + t * ITEMS
        last = first + ITEMS if first + ITEMS < n else n  # (CUDA's min of two ints does not compile here)
        for i in range(first, last):
            cuda.atomic.add(tally, np.int64((keys[i] >> shift) & np.uint64(DIGITS - 1)), 1)
        cuda.syncthreads()
        if t < DIGITS:
            counts[t * cuda.gridDim.x + b] = tally[t]

    @cuda.jit
    def scatter(keys, vals, n, shift, offsets, out_keys, out_vals):
        """Each pair to offsets[d * n_blocks + b] + the pairs of digit d before it in block b's tile."""
        before = cuda.shared.array((DIGITS, THREADS), np.int32)
        mine = cuda.local.array(DIGITS, np.int32)
        t = cuda.threadIdx.x
        b = cuda.blockIdx.x
        for d in range(DIGITS):
            mine[d] = 0
        first = b * TILE + t * ITEMS
        last = first + ITEMS if first + ITEMS < n else n
        for i in range(first, last):
            mine[np.int64((keys[i] >> shift) & np.uint64(DIGITS - 1))] += 1
        for d in range(DIGITS):
            before[d, t] = mine[d]
        cuda.syncthreads()
        if t < DIGITS:
            run = 0
            for u in range(THREADS):
                c = before[t, u]
                before[t, u] = run
                run += c
        cuda.syncthreads()
        for d in range(DIGITS):
            mine[d] = 0
        for i in range(first, last):
            d = np.int64((keys[i] >> shift) & np.uint64(DIGITS - 1))
            at = offsets[d * cuda.gridDim.x + b] + before[d, t] + mine[d]
            mine[d] += 1
            out_keys[at] = keys[i]
            out_vals[at] = vals[i]

    return count_digits, scatter


def sort_pairs(keys, vals, tmp_keys, tmp_vals, stream=0) -> None:
    """Sort device arrays keys ascending, vals along (stably), with tmp_keys/tmp_vals of their length."""
    n = keys.shape[0]
    if n < 2:
        return
    count_digits, scatter = kernels()
    n_blocks = (n + TILE - 1) // TILE
    counts = cuda.device_array(DIGITS * n_blocks, np.int32, stream=stream)
    src_k, src_v, dst_k, dst_v = keys, vals, tmp_keys, tmp_vals
    for p in range(64 // 4):
        shift = np.uint64(4 * p)
        count_digits[n_blocks, THREADS, stream](src_k, n, shift, counts)
        host = counts.copy_to_host(stream=stream)
        stream_sync(stream)
        per_digit = host.reshape(DIGITS, n_blocks).sum(axis=1)
        if per_digit.max() == n:
            continue
        offsets = np.zeros(DIGITS * n_blocks, np.int64)
        np.cumsum(host[:-1], out=offsets[1:])
        scatter[n_blocks, THREADS, stream](src_k, src_v, n, shift, cuda.to_device(offsets, stream=stream), dst_k,
                                           dst_v)  # fmt: skip
        src_k, src_v, dst_k, dst_v = dst_k, dst_v, src_k, src_v
    if src_k is not keys:
        keys.copy_to_device(src_k, stream=stream)
        vals.copy_to_device(src_v, stream=stream)


def stream_sync(stream) -> None:
    if stream:
        stream.synchronize()
    else:
        cuda.synchronize()
