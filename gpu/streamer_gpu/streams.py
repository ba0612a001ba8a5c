"""The CUDA streams the GPU stages launch and copy on: ordinary ones, or the device's lowest priority.

On a Jetson the daemon shares the GPU with MinKNOW's live basecaller, which must keep its latency.
CUDA orders streams by a priority within the range the device reports (`cuCtxGetStreamPriorityRange`:
least 0, greatest -5 on current GPUs; lower numbers go first): the scheduler starts a
higher-priority stream's blocks before a lower one's within a context, and between processes
under MPS; processes without MPS take turns in time slices whatever their streams' priorities.
The lowest priority is also an ordinary stream's, so `low` yields to every stream asked for above
it and never takes precedence. numba-cuda makes ordinary streams only: a prioritised one is made
through the driver and handed to numba as an external stream, destroyed with its object. Where the
driver (or the simulator) has no priorities, the stream is an ordinary one, said once a process.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any

from numba import cuda

from streamer_gpu.target import CUDA_ERRORS, SIMULATED

log = logging.getLogger(__name__)

PRIORITIES = ("normal", "low", "high")  # `high` for tools beside the daemon (benchmarks' stand-in basecaller)
_said: set[str] = set()


@dataclass(frozen=True)
class PriorityStream:
    """A stream to launch on, the priority it was asked for, and the driver's number for it (None: an
    ordinary stream, where the driver has no priorities or `normal` was asked for)."""

    stream: Any
    asked: str
    number: int | None = None


def open_stream(priority: str = "normal") -> PriorityStream:
    """A stream on the current device at `priority` (one of PRIORITIES)."""
    if priority not in PRIORITIES:
        raise ValueError(f"stream priority {priority!r}: expected one of {', '.join(PRIORITIES)}")
    if priority == "normal":
        return PriorityStream(cuda.stream(), priority)
    if SIMULATED:
        _say_once("numba's CUDA simulator has no stream priorities: kernels run on ordinary streams", logging.INFO)
        return PriorityStream(cuda.stream(), priority)
    try:
        from numba.cuda.cudadrv.driver import CudaDriverError, driver
    except ImportError as exc:
        _say_once(f"no CUDA driver interface for stream priorities ({exc}): kernels run on ordinary streams")
        return PriorityStream(cuda.stream(), priority)
    try:
        least, greatest = (int(x) for x in driver.cuCtxGetStreamPriorityRange())
        number = least if priority == "low" else greatest
        handle = driver.cuStreamCreateWithPriority(0, number)
    except (AttributeError, TypeError, ValueError, CudaDriverError, *CUDA_ERRORS) as exc:
        _say_once(f"this CUDA driver binding makes no prioritised streams ({type(exc).__name__}: {exc}): kernels "
                  "run on ordinary streams")
        return PriorityStream(cuda.stream(), priority)
    context = cuda.current_context()
    stream = context.create_external_stream(int(handle))
    # as numba's own streams: destroyed through the context's deferred deallocations
    weakref.finalize(stream, context.deallocations.add_item, driver.cuStreamDestroy, handle)
    _say_once(f"GPU kernels on {priority}-priority streams (priority {number} of {least} lowest, {greatest} highest)",
              logging.INFO)
    return PriorityStream(stream, priority, number)


def _say_once(line: str, level: int = logging.WARNING) -> None:
    if line not in _said:
        _said.add(line)
        log.log(level, "%s", line)
