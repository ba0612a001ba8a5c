"""The CUDA driver started at a command's first step, beside its imports.

`streamer call` and `eventalign` wait for the driver's start and the GPU's primary context (about a
second on a data-centre GPU, `benchmarks/RESULTS-cpu-half.md`) before they plan, and their imports
(numpy, numba, the formats) take about as long before that. Both are begun here, on a thread of its
own, through the driver's C interface: ctypes lets the GIL go while the driver works, so the imports go
on meanwhile, and numba-cuda later takes the same primary context. Where there is no driver, no such
device or the simulator, the thread ends quietly, and the command finds out as it always did.
"""

from __future__ import annotations

import ctypes
import os
import threading

COMMANDS = ("call", "eventalign")  # those whose start-up is part of every run's wall time
_FOUND = threading.Event()  # set once the driver has the device: a GPU start-up is coming
_ANSWERED = threading.Event()  # set once that is known either way (or no thread asks the driver)


def device_of(argv: list[str]) -> int | None:
    """The first GPU `--cuda-dev-id` names (0 when not given, or `all`); None under `--disable-cuda`."""
    if "--disable-cuda" in argv:
        return None
    value = "0"
    for i, arg in enumerate(argv):
        if arg == "--cuda-dev-id" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--cuda-dev-id="):
            value = arg.partition("=")[2]
    first = value.split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def start(command: str, argv: list[str]) -> threading.Thread | None:
    """Begin the driver and device `device_of(argv)`'s primary context for a command of `COMMANDS`."""
    dev_id = device_of(argv)
    if command not in COMMANDS or dev_id is None or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        _ANSWERED.set()
        return None
    thread = threading.Thread(target=_retain_primary, args=(dev_id,), name="cuda-start", daemon=True)
    thread.start()
    return thread


def _retain_primary(dev_id: int) -> None:
    device, context = ctypes.c_int(), ctypes.c_void_p()
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        if driver.cuInit(0) == 0 and driver.cuDeviceGet(ctypes.byref(device), dev_id) == 0:
            _FOUND.set()
            _ANSWERED.set()
            driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)  # kept for the process, as numba keeps it
    except (OSError, AttributeError):  # no driver here, or not one that has these calls
        return
    finally:
        _ANSWERED.set()


def found(timeout: float) -> bool:
    """Whether the thread `start` began has found its device, waiting at most `timeout` seconds for the
    answer (none where no thread was begun, or once it ends without the device)."""
    _ANSWERED.wait(timeout)
    return _FOUND.is_set()
