"""GPU event detection against the CPU's, printed as JSON for tests/test_gpu_events.py.

Run in a subprocess: numba's CUDA simulator is chosen by NUMBA_ENABLE_CUDASIM before numba is
imported. Under the simulator the fixture reads are cut to their first samples (it runs each
thread in Python); on a GPU they are whole.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "gpu"), str(ROOT)]

from numba import config  # noqa: E402

from streamer.io.fast5 import iter_fast5  # noqa: E402
from streamer.pipeline.events import DNA_PARAMS, RNA_PARAMS, EventParams, detect_events  # noqa: E402
from streamer_gpu.events import CudaEvents  # noqa: E402

SIMULATED = bool(config.ENABLE_CUDASIM)
CUT = 1200 if SIMULATED else None


def pack(signals):
    off = np.zeros(len(signals) + 1, np.int64)
    np.cumsum([len(s) for s in signals], out=off[1:])
    return (np.concatenate(signals) if signals else np.zeros(0)).astype(np.float32), off


def fixture_reads():
    paths = sorted((ROOT / "tests" / "data" / "ecoli" / "fast5").glob("*.fast5"))
    return [rec.to_pa()[:CUT] for path in paths for rec in iter_fast5(path)]


def edge_reads():
    """Reads shorter than the windows, constant signal, float32 extremes (no NaN), a clean step."""
    rng = np.random.default_rng(5)
    reads = [rng.normal(90, 5, n) for n in (0, 1, 2, 3, 5, 6, 7, 11, 12, 13, 20, 28, 29)]
    reads += [np.full(300, 80.0), np.full(40, 3e38), np.full(40, 1e-38), np.zeros(40)]
    reads += [rng.choice([0.0, 1e19, -1e19, 1e-30, 3e38, -3e38], 400), rng.normal(0, 1e10, 300)]
    reads += [np.repeat([70.0, 110.0], 50), np.repeat(rng.normal(90, 20, 60), rng.integers(1, 12, 60))]
    return [np.asarray(r, np.float32) for r in reads]


def same(a, b) -> bool:
    return all(x.dtype == y.dtype and np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(a, b))


def compare(gpu: CudaEvents, signals, params, spread: bool = True) -> dict:
    signal, off = pack(signals)
    got, stats = gpu.detect(signal, off, params, spread)
    want = detect_events(signal, off, params, spread)
    return {"same": same(want, got) and [len(x) for x in want] == [len(x) for x in got], "n_events": int(got[0][-1]),
            "on_gpu": stats.on_gpu, "fallback": stats.fallback}  # fmt: skip


def main() -> None:
    np.seterr(all="ignore")  # the simulator's numpy scalars warn on the extremes, as IEEE arithmetic overflows
    fixture, edges = fixture_reads(), edge_reads()
    gpu = CudaEvents(0)
    chunked = CudaEvents(0, chunk_samples=1000)
    odd = EventParams(w1=1, w2=31, threshold1=0.5, threshold2=3.0, peak_height=0.1)
    cases = {
        "fixture_dna": compare(gpu, fixture, DNA_PARAMS),
        "fixture_rna": compare(gpu, fixture, RNA_PARAMS),
        "edges_dna": compare(gpu, edges, DNA_PARAMS),
        "edges_rna": compare(gpu, edges, RNA_PARAMS),
        "edges_odd_windows": compare(gpu, edges, odd),
        "chunked": compare(chunked, fixture[:3] + edges, DNA_PARAMS),
        "means_only": compare(chunked, fixture[:3] + edges, DNA_PARAMS, spread=False),
        "empty_batch": compare(gpu, [], DNA_PARAMS),
        "long_windows": compare(gpu, edges, EventParams(w1=3, w2=40)),
    }
    os.environ["STREAMER_CUDA_FAULT"] = "events:1"
    cases["fault"] = compare(CudaEvents(0), edges, DNA_PARAMS)
    print(json.dumps(cases))


if __name__ == "__main__":
    main()
