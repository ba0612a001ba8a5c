"""Device arrays kept from batch to batch, and the copies in and out of them.

No allocation per batch once the largest has been seen. The copies go to and from the start of a whole
buffer by byte count: a slice of a device array (`buffer[:n]`) is a new view object with its own
pointer and finalizer, made under the GIL, and a batch's stages made dozens of them (about half a
second of the GIL over a 66 Mbases run on a GPU box, while other threads waited for it).
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import driver

from streamer_gpu.target import SIMULATED


class DeviceBuffers:
    """Device arrays by name, reallocated only when a batch needs more rows than they hold."""

    def __init__(self) -> None:
        self._arrays: dict[str, cuda.devicearray.DeviceNDArray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype) -> cuda.devicearray.DeviceNDArray:
        """The whole buffer, of at least shape[0] rows of shape[1:] (kernels are given the counts they need)."""
        a = self._arrays.get(name)
        if a is None or a.shape[0] < shape[0] or a.shape[1:] != shape[1:] or a.dtype != dtype:
            self._arrays.pop(name, None)
            a = cuda.device_array((max(shape[0], 1) * 5 // 4 + 1, *shape[1:]), dtype)
            self._arrays[name] = a
        return a

    def put(self, name: str, host: np.ndarray, stream) -> cuda.devicearray.DeviceNDArray:
        """`host` into the start of the buffer `name` (grown to hold it); the whole buffer."""
        dev = self.get(name, host.shape, host.dtype)
        to_device(dev, host, stream)
        return dev


def to_device(dev: cuda.devicearray.DeviceNDArray, host: np.ndarray, stream) -> None:
    """`host` into the start of `dev` (of its dtype and row shape, and at least as long), on `stream`."""
    host = np.ascontiguousarray(host)
    if SIMULATED:  # its driver copies the leading bytes of the first axis: a slice's copy instead
        dev[: len(host)].copy_to_device(host, stream=stream)
    elif host.nbytes:
        driver.host_to_device(dev, host, host.nbytes, stream=stream)


def to_host(dev: cuda.devicearray.DeviceNDArray, n: int, stream) -> np.ndarray:
    """The first n rows of `dev`, as a new host array, on `stream` (whose earlier work they wait for)."""
    if SIMULATED:
        return dev[:n].copy_to_host(stream=stream)
    out = np.empty((n, *dev.shape[1:]), dev.dtype)
    if out.nbytes:
        driver.device_to_host(out, dev, out.nbytes, stream=stream)
    return out
