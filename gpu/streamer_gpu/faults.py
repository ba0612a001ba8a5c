"""A CUDA error on demand, to show that a failing GPU loses no read: `STREAMER_CUDA_FAULT`.

`STREAMER_CUDA_FAULT=abea:1,hmm:3` makes the first call of the GPU ABEA stage and the third
of the GPU CpG HMM (`events:n`: GPU event detection; `seeds:n`: GPU seeding; `chain:n`: GPU
chaining; `extend:n`: GPU extension) raise the device out-of-memory error a real launch raises (call 1
is the pipeline's warm-up batch, call 2 the first batch of reads). Each part counts its own calls: the
events that run ahead on the front lane (`Pipeline.front_device`) count from the first batch of reads.
Read when a GPU stage opens; unset, `check` costs a dictionary look-up.
"""

from __future__ import annotations

import os
import threading

from numba.cuda.cudadrv.driver import CudaAPIError

ENV = "STREAMER_CUDA_FAULT"
CUDA_ERROR_OUT_OF_MEMORY = 2


def parse(spec: str) -> dict[str, frozenset[int]]:
    """`abea:1,hmm:3,hmm:4` -> {"abea": {1}, "hmm": {3, 4}}."""
    calls: dict[str, set[int]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        site, _, n = item.partition(":")
        calls.setdefault(site, set()).add(int(n))
    return {site: frozenset(ns) for site, ns in calls.items()}


class FaultPlan:
    """Counts each site's calls and raises at the planned ones."""

    def __init__(self, spec: str = ""):
        self.calls = parse(spec)
        self.seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def check(self, site: str) -> None:
        if not self.calls:
            return
        with self._lock:
            n = self.seen[site] = self.seen.get(site, 0) + 1
        if n in self.calls.get(site, ()):
            raise CudaAPIError(CUDA_ERROR_OUT_OF_MEMORY, f"CUDA_ERROR_OUT_OF_MEMORY (injected: {site} call {n})")


def from_env() -> FaultPlan:
    return FaultPlan(os.environ.get(ENV, ""))
