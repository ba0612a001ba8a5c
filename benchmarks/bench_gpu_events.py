"""Event detection on the GPU against the CPU kernel: identical events, and the stage's time on each.

The shared reads' signal (every read of the FAST5 files under --data), tiled --copies times in
memory as one batch (100 copies: about 600 M samples, the issue's 66 Mbases), is segmented by the
CPU kernel (`streamer.pipeline.events.detect_events`, numba over -t threads) and by
`streamer_gpu.events.CudaEvents`; the five event arrays are compared bit for bit, and each side is
timed --repeat times after a warm-up (the GPU's split into copies in, kernels and copies back). The GPU
is timed again making the means alone (`spread=False`: what a run that renders no event asks, its copies
back a fifth of the bytes). Exits 1 when any event differs. Runs from a checkout without installing it:

    PYTHONPATH=$PWD:$PWD/gpu:$PWD/plugins python benchmarks/bench_gpu_events.py \\
        --data /work/shared/data/ecoli_2kb_region --copies 100 -t 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numba
import numpy as np

from streamer.io.fast5 import iter_fast5
from streamer.pipeline.events import DNA_PARAMS, detect_events


def load_signals(data: Path) -> list[np.ndarray]:
    paths = sorted((data / "fast5_files").glob("*.fast5")) or sorted(data.rglob("*.fast5"))
    if not paths:
        raise SystemExit(f"no FAST5 files under {data}")
    return [rec.to_pa() for path in paths for rec in iter_fast5(path)]


def tiled(signals: list[np.ndarray], copies: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(s) for s in signals] * copies, np.int64)
    off = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=off[1:])
    return np.tile(np.concatenate(signals).astype(np.float32), copies), off


def timed(fn, repeat: int) -> tuple[list[float], object]:
    out = fn()  # warm-up: compiles or loads the kernels, grows the device buffers
    seconds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - t0)
    return seconds, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the shared ecoli_2kb_region folder")
    ap.add_argument("--copies", type=int, default=10, help="times the reads are tiled [%(default)s]")
    ap.add_argument("-t", "--threads", type=int, default=numba.config.NUMBA_NUM_THREADS, help="CPU threads")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each side [%(default)s]")
    ap.add_argument("--dev-id", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()

    from numba import cuda

    from streamer_gpu.events import CudaEvents

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    signal, off = tiled(load_signals(args.data), args.copies)
    gpu = CudaEvents(args.dev_id)
    device = cuda.current_context().device
    name = getattr(device, "name", "CUDA simulator")
    name = name.decode() if isinstance(name, bytes) else str(name)
    print(f"{len(off) - 1} reads, {len(signal) / 1e6:.1f} M samples; CPU {numba.get_num_threads()} threads; "
          f"GPU {args.dev_id}: {name}", flush=True)  # fmt: skip

    cpu_s, cpu_events = timed(lambda: detect_events(signal, off, DNA_PARAMS), args.repeat)
    gpu_s, (gpu_events, last) = timed(lambda: gpu.detect(signal, off, DNA_PARAMS), args.repeat)
    lean_s, (lean_events, lean) = timed(lambda: gpu.detect(signal, off, DNA_PARAMS, spread=False), args.repeat)
    names = ("ev_off", "ev_start", "ev_length", "ev_mean", "ev_stdv")
    differ = [n for n, a, b in zip(names, cpu_events, gpu_events)
              if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a.view(np.uint8), b.view(np.uint8))]  # fmt: skip
    if not (np.array_equal(lean_events[0], cpu_events[0]) and np.array_equal(lean_events[3].view(np.uint32),
                                                                              cpu_events[3].view(np.uint32))):
        differ.append("ev_mean (means alone)")
    result = {
        "device": name,
        "reads": len(off) - 1,
        "samples": int(len(signal)),
        "events": int(cpu_events[0][-1]),
        "cpu_threads": numba.get_num_threads(),
        "cpu_s": cpu_s,
        "gpu_s": gpu_s,
        "gpu_split_s": {"h2d": last.t_h2d, "kernels": last.t_kernels, "d2h": last.t_d2h},
        "gpu_means_only_s": lean_s,
        "gpu_means_only_split_s": {"h2d": lean.t_h2d, "kernels": lean.t_kernels, "d2h": lean.t_d2h},
        "gpu_on_gpu": last.on_gpu,
        "gpu_fallback": last.fallback,
        "identical": not differ,
        "differ": differ,
    }
    best_cpu, best_gpu = min(cpu_s), min(gpu_s)
    print(f"CPU {best_cpu:.3f} s ({len(signal) / best_cpu / 1e6:.0f} M samples/s); GPU {best_gpu:.3f} s "
          f"({len(signal) / best_gpu / 1e6:.0f} M samples/s: h2d {last.t_h2d:.3f}, kernels {last.t_kernels:.3f}, "
          f"d2h {last.t_d2h:.3f}); {best_cpu / best_gpu:.1f}x")  # fmt: skip
    print(f"GPU, the means alone: {min(lean_s):.3f} s (h2d {lean.t_h2d:.3f}, kernels {lean.t_kernels:.3f}, "
          f"d2h {lean.t_d2h:.3f})")  # fmt: skip
    print("events identical" if not differ else f"EVENTS DIFFER in {', '.join(differ)}")
    if last.fallback:
        print(f"the GPU path fell back to the CPU: {last.fallback}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if not differ and last.on_gpu else 1


if __name__ == "__main__":
    sys.exit(main())
