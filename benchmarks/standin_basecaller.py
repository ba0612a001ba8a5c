"""A stand-in for a live basecaller on the same GPU: a loop of matrix products, then a pause, forever.

Each cycle launches `repeats` products of two `size` x `size` float32 matrices (a shared-memory
tiled numba.cuda kernel; no cupy needed), waits for them, and sleeps `pause` seconds: the rest of
a basecaller's loop (reading the next chunk of signal). Alone its period is the GPU work plus the
pause; another process's kernels on the GPU lengthen the work and so the period, which is what
`benchmarks/jetson_emulation.py` compares with and without the daemon beside it.

`--calibrate DUTY` picks `repeats` so that the work alone takes DUTY of `--period-ms` and the pause
the rest (printed, so the second run can be given the same `--repeats` and `--pause-ms`).
`--priority high` launches on a stream of the device's highest priority (`streamer_gpu.streams`),
as a basecaller that asks for one would. Writes every cycle's start, work and period to `--out`
(JSON) at the end (`--seconds`, or SIGTERM/SIGINT).

    python benchmarks/standin_basecaller.py --seconds 30 --calibrate 0.5 --out alone.json
    python benchmarks/standin_basecaller.py --seconds 30 --repeats 12 --pause-ms 50 --out beside.json
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import time
from pathlib import Path

import numpy as np
from numba import cuda, float32

from streamer_gpu.streams import open_stream

TILE = 16


@cuda.jit
def matmul(a, b, c):
    """c = a @ b for square matrices, TILE x TILE blocks through shared memory."""
    sa = cuda.shared.array((TILE, TILE), float32)
    sb = cuda.shared.array((TILE, TILE), float32)
    col, row = cuda.grid(2)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    n = c.shape[0]
    acc = float32(0.0)
    for t in range((n + TILE - 1) // TILE):
        k = t * TILE
        sa[ty, tx] = a[row, k + tx] if row < n and k + tx < n else float32(0.0)
        sb[ty, tx] = b[k + ty, col] if col < n and k + ty < n else float32(0.0)
        cuda.syncthreads()
        for j in range(TILE):
            acc += sa[ty, j] * sb[j, tx]
        cuda.syncthreads()
    if row < n and col < n:
        c[row, col] = acc


class Load:
    """The matrices on the device and the launch of one cycle's work."""

    def __init__(self, size: int, priority: str):
        self.stream = open_stream(priority).stream
        rng = np.random.default_rng(0)
        self.a = cuda.to_device(rng.random((size, size), np.float32), stream=self.stream)
        self.b = cuda.to_device(rng.random((size, size), np.float32), stream=self.stream)
        self.c = cuda.device_array((size, size), np.float32, stream=self.stream)
        blocks = (size + TILE - 1) // TILE
        self.grid = (blocks, blocks)

    def work(self, repeats: int) -> float:
        """Seconds `repeats` products take, launch to completion."""
        t0 = time.perf_counter()
        for _ in range(repeats):
            matmul[self.grid, (TILE, TILE), self.stream](self.a, self.b, self.c)
        self.stream.synchronize()
        return time.perf_counter() - t0


def calibrate(load: Load, period: float, duty: float) -> tuple[int, float]:
    """Repeats whose work takes about duty x period (median of a few tries), and the pause for the rest."""
    load.work(1)  # compiled, and the clocks up
    one = statistics.median(load.work(1) for _ in range(5))
    repeats = max(1, round(duty * period / one))
    work = statistics.median(load.work(repeats) for _ in range(5))
    return repeats, max(0.0, period - work)


def summary(values: list[float]) -> dict[str, float]:
    """Mean, p50, p99 and max of seconds, in milliseconds."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(values), "mean_ms": 1e3 * statistics.fmean(values), "p50_ms": 1e3 * at(0.5),
            "p99_ms": 1e3 * at(0.99), "max_ms": 1e3 * ordered[-1]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--size", type=int, default=1024, help="matrix side [%(default)s]")
    ap.add_argument("--period-ms", type=float, default=100.0, help="with --calibrate: the period alone [%(default)s]")
    ap.add_argument("--calibrate", type=float, metavar="DUTY", help="share of the period the GPU work takes alone")
    ap.add_argument("--repeats", type=int, default=8, help="products per cycle [%(default)s]")
    ap.add_argument("--pause-ms", type=float, default=50.0, help="pause after each cycle's work [%(default)s]")
    ap.add_argument("--priority", choices=("normal", "high"), default="normal", help="its CUDA stream's [%(default)s]")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    load = Load(args.size, args.priority)
    repeats, pause = args.repeats, args.pause_ms / 1e3
    if args.calibrate is not None:
        repeats, pause = calibrate(load, args.period_ms / 1e3, args.calibrate)
    else:
        load.work(1)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    print(json.dumps({"repeats": repeats, "pause_ms": pause * 1e3}), flush=True)  # the run has begun
    starts, works = [], []
    end = time.perf_counter() + args.seconds
    while not stop and time.perf_counter() < end:
        starts.append(time.perf_counter())
        works.append(load.work(repeats))
        time.sleep(pause)
    periods = [b - a for a, b in zip(starts, starts[1:])]
    t0 = starts[0] if starts else 0.0
    args.out.write_text(json.dumps({
        "size": args.size, "repeats": repeats, "pause_ms": pause * 1e3, "priority": args.priority,
        "period": summary(periods), "work": summary(works),
        "cycles": [[round(s - t0, 6), round(w, 6)] for s, w in zip(starts, works)],
    }) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
