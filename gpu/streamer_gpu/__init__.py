"""GPU kernels (numba-CUDA), the device memory arena, and CUDA as a compile target; an install extra
(`streamer[gpu]`).

This package builds on the core (`streamer`) and never on the plugins: a plugin with GPU work
(the CpG HMM) keeps its kernel and compiles it with `streamer_gpu.target`. The core reaches this
package only through `streamer.pipeline.gpu.gpu_package`, typed by its `GpuPackage`, when a GPU stage
is asked for. Only
`open_gpu` touches CUDA, and only when asked: the base install, and machines without a GPU,
never need numba-cuda.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from streamer.pipeline.gpu import CudaOptions
from streamer_gpu.device import probe_gpu

if TYPE_CHECKING:
    import numpy as np

    from streamer.align.fmindex import FMIndex, Text
    from streamer_gpu.abea import CudaAbea
    from streamer_gpu.chain import CudaChainer
    from streamer_gpu.events import CudaEvents
    from streamer_gpu.extend import CudaExtender
    from streamer_gpu.fmindex import CudaFmSeeder

__all__ = ["arena_bases", "build_fmindex", "chainer", "count_gpus", "device_bytes", "device_context", "extender",
           "fm_seeder",
           "gpu_absent", "is_cuda_error", "open_events", "open_gpu", "open_lane", "probe_gpu", "release_gpu"]

log = logging.getLogger(__name__)
_said: set[tuple[str, str]] = set()


def gpu_absent(stage: str) -> bool:
    """True when this install or machine has no CUDA GPU for `stage`, said once a process (a daemon builds
    its pipeline again when the run's pore differs from the one it started with)."""
    try:
        from numba import cuda
    except ImportError as exc:
        why = f"no CUDA support in this install ({exc})"
    else:
        if cuda.is_available():
            return False
        why = "no CUDA GPU found"
    if (why, stage) not in _said:
        _said.add((why, stage))
        log.info("%s: %s runs on the CPU", why, stage)
    return True


def open_gpu(options: CudaOptions, bandwidth: int = 100) -> CudaAbea | None:
    """The GPU ABEA stage on options.dev_id, or None, said in one log line, when there is none to use."""
    if options.disable or gpu_absent("ABEA"):
        return None
    from streamer_gpu.abea import CudaAbea, TooLittleMemory
    from streamer_gpu.target import CUDA_ERRORS

    try:
        return CudaAbea(options, bandwidth)
    except TooLittleMemory as exc:
        log.warning("too little free memory on GPU %d (%s): this process runs on the CPU", options.dev_id, exc)
    except CUDA_ERRORS as exc:
        log.warning("could not start ABEA on GPU %d (%s): ABEA runs on the CPU", options.dev_id, exc)
    return None


def open_lane(abea: CudaAbea) -> CudaAbea | None:
    """A further lane on abea's device: an arena of the same size, its own stream; None, said in one log line,
    where the device cannot hold it (its batches then take turns on the lanes that opened)."""
    from streamer_gpu.abea import CudaAbea
    from streamer_gpu.target import CUDA_ERRORS

    try:
        return CudaAbea(abea.options, abea.arena.bandwidth, abea.layout, arena_bytes=abea.arena.n_bytes)
    except CUDA_ERRORS as exc:
        log.warning("could not open another lane on GPU %d (%s): its batches take turns", abea.options.dev_id, exc)
    return None


def open_events(options: CudaOptions) -> CudaEvents | None:
    """Event detection on GPU options.dev_id (whose ABEA stage opened), or None, said in one log line, where it
    cannot start."""
    from streamer_gpu.events import CudaEvents
    from streamer_gpu.target import CUDA_ERRORS

    try:
        return CudaEvents(options.dev_id, stream_priority=options.stream_priority)
    except CUDA_ERRORS as exc:
        log.warning("could not start event detection on GPU %d (%s): it runs on the CPU", options.dev_id, exc)
    return None


def build_fmindex(text: Text, budget: int, kmer_len: int | None = None) -> FMIndex | None:
    """The FM-index of text built on the current GPU, or None, said in one log line, where it cannot be."""
    if gpu_absent("the FM-index build"):
        return None
    from streamer_gpu.fmindex import build
    from streamer_gpu.target import CUDA_ERRORS

    try:
        return build(text, budget, kmer_len)
    except CUDA_ERRORS as exc:
        log.warning("could not build the FM-index on the GPU (%s): it is built on the CPU", exc)
    return None


def fm_seeder(index: FMIndex) -> CudaFmSeeder | None:
    """Seeding against index on the current GPU, or None, said in one log line, where it cannot start."""
    if gpu_absent("seeding"):
        return None
    from streamer_gpu.fmindex import seeder_for
    from streamer_gpu.target import CUDA_ERRORS

    try:
        return seeder_for(index)
    except CUDA_ERRORS as exc:
        log.warning("could not copy the FM-index to the GPU (%s): seeding runs on the CPU", exc)
    return None


def extender(genome: np.ndarray) -> CudaExtender | None:
    """Extension's DP against genome (copied there once) on the current GPU, or None, said in one log line,
    where it cannot start."""
    if gpu_absent("extension"):
        return None
    from streamer_gpu.extend import CudaExtender
    from streamer_gpu.target import CUDA_ERRORS

    try:
        return CudaExtender(genome)
    except CUDA_ERRORS as exc:
        log.warning("could not copy the genome to the GPU (%s): extension runs on the CPU", exc)
    return None


def chainer() -> CudaChainer | None:
    """Chaining on the current GPU, or None, said in one log line, where there is none."""
    if gpu_absent("chaining"):
        return None
    from streamer_gpu.chain import chainer_for

    return chainer_for()


def count_gpus() -> int:
    """GPUs on this host (0 without numba-cuda or a GPU)."""
    try:
        from numba import cuda
    except ImportError:
        return 0
    return len(cuda.gpus) if cuda.is_available() else 0


def device_context(dev_id: int):
    """What makes GPU dev_id current on a thread for one batch (and the previous one current after it)."""
    from numba import cuda

    return lambda: cuda.gpus[dev_id]


def release_gpu() -> None:
    """Give the memory of dropped GPU stages back to the driver now, not at numba's next flush."""
    import gc

    from numba import cuda

    from streamer_gpu.target import CUDA_ERRORS

    gc.collect()
    try:
        pending = getattr(cuda.current_context(), "deallocations", None)  # the simulator keeps none
        if pending is not None:
            pending.clear()
    except CUDA_ERRORS as exc:
        log.debug("GPU memory not given back (%s)", exc)


def is_cuda_error(exc: BaseException) -> bool:
    """A failed launch, copy, allocation or module load on a GPU (asked only where a GPU stage ran)."""
    from streamer_gpu.target import CUDA_ERRORS

    return isinstance(exc, CUDA_ERRORS)


def arena_bases(n_bytes: int, avg_epk: float, bandwidth: int) -> int:
    """Read bases an ABEA arena of n_bytes holds (`streamer_gpu.host.arena_capacity`)."""
    from streamer_gpu.host import arena_capacity

    return arena_capacity(n_bytes, avg_epk, bandwidth).bases


def device_bytes(options: CudaOptions, bandwidth: int, resident_threads: int) -> int:
    """Device bytes a process takes for options' batches (`streamer_gpu.memory.device_bytes_for`)."""
    from streamer_gpu.memory import device_bytes_for

    return device_bytes_for(options, bandwidth, resident_threads)
