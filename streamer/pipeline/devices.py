"""Which GPU lane a batch goes to: the least loaded of the host's, counted in batches in flight.

Pure bookkeeping over any device objects (a test passes plain strings), so that the choice is
the same for real GPUs, the CUDA simulator and fakes. A batch takes a lane for all its GPU
stages (ABEA, then the HMM, on the same lane: the HMM reads what ABEA left nowhere else, and
a lane's memory is sized for one batch at a time per stage, so its batches take turns).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Generic, TypeVar

D = TypeVar("D")


class DevicePool(Generic[D]):
    """`take` the least loaded device (the lowest index among equals), `give` it back when the batch is done."""

    def __init__(self, devices: Sequence[D]):
        self.devices = list(devices)
        self.load = [0] * len(self.devices)
        self.batches = [0] * len(self.devices)  # batches each device has taken, for the summary and tests
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """Index of the device the next batch runs on, or None when there is none."""
        if not self.devices:
            return None
        with self._lock:
            i = min(range(len(self.devices)), key=lambda j: (self.load[j], j))
            self.load[i] += 1
            self.batches[i] += 1
            return i

    def give(self, i: int | None) -> None:
        if i is not None:
            with self._lock:
                self.load[i] -= 1

    def drop(self, i: int) -> None:
        """Device i failed at start-up: no batch goes there again."""
        with self._lock:
            del self.devices[i], self.load[i], self.batches[i]
