"""Running sums of an int64 device array on the device: the offsets that counted outputs are written
at (the seeds of each read end), without copying the counts to the host and the sums back.

A block sums its tile (ITEMS a thread, each thread's run in order, the threads' totals summed in
shared memory), writes its tile's inclusive sums and its total; the host adds up the totals (one a
tile, a few kilobytes) and a second kernel adds each tile's offset.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from streamer_gpu.target import SIMULATED

THREADS = 32 if SIMULATED else 256
ITEMS = 16
TILE = THREADS * ITEMS


@functools.cache
def kernels():
    @cuda.jit
    def tile_sums(values, n, out, totals):
        """out[i + 1]: the sum of values up to i within i's tile; totals[b]: tile b's sum."""
        before = cuda.shared.array(THREADS, np.int64)
        t = cuda.threadIdx.x
        b = cuda.blockIdx.x
        first = b * TILE + t * ITEMS
        last = first + ITEMS if first + ITEMS < n else n
        run = np.int64(0)
        for i in range(first, last):
            run += values[i]
        before[t] = run
        cuda.syncthreads()
        if t == 0:
            acc = np.int64(0)
            for u in range(THREADS):
                c = before[u]
                before[u] = acc
                acc += c
            totals[b] = acc
        cuda.syncthreads()
        run = before[t]
        for i in range(first, last):
            run += values[i]
            out[i + 1] = run

    @cuda.jit
    def add_offsets(out, n, offsets):
        i = cuda.grid(1)
        if i < n:
            out[i + 1] += offsets[i // TILE]

    return tile_sums, add_offsets


def running_sums(values, stream=0):
    """A device array of len(values) + 1: 0, then the running sums of int64 device array values, and
    the total (on the host)."""
    n = values.shape[0]
    tile_sums, add_offsets = kernels()
    out = cuda.device_array(n + 1, np.int64, stream=stream)
    out[:1].copy_to_device(np.zeros(1, np.int64), stream=stream)
    if n == 0:
        return out, 0
    n_tiles = (n + TILE - 1) // TILE
    totals = cuda.device_array(n_tiles, np.int64, stream=stream)
    tile_sums[n_tiles, THREADS, stream](values, n, out, totals)
    host = totals.copy_to_host(stream=stream)
    offsets = np.zeros(n_tiles, np.int64)
    np.cumsum(host[:-1], out=offsets[1:])
    add_offsets[(n + 255) // 256, 256, stream](out, n, cuda.to_device(offsets, stream=stream))
    return out, int(offsets[-1] + host[-1])
