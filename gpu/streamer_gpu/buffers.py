"""Device arrays kept from batch to batch: no allocation per batch once the largest has been seen."""

from __future__ import annotations

import numpy as np
from numba import cuda


class DeviceBuffers:
    """Device arrays by name, reallocated only when a batch needs more rows than they hold."""

    def __init__(self) -> None:
        self._arrays: dict[str, cuda.devicearray.DeviceNDArray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype) -> cuda.devicearray.DeviceNDArray:
        a = self._arrays.get(name)
        if a is None or a.shape[0] < shape[0] or a.shape[1:] != shape[1:] or a.dtype != dtype:
            self._arrays.pop(name, None)
            a = cuda.device_array((max(shape[0], 1) * 5 // 4 + 1, *shape[1:]), dtype)
            self._arrays[name] = a
        return a[: shape[0]]

    def put(self, name: str, host: np.ndarray, stream) -> cuda.devicearray.DeviceNDArray:
        dev = self.get(name, host.shape, host.dtype)
        if host.shape[0]:
            dev.copy_to_device(np.ascontiguousarray(host), stream=stream)
        return dev
