"""Which CUDA stream every kernel launch and copy of the GPU stages takes, printed as JSON for
tests/test_gpu_streams.py.

Run in a subprocess under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 before numba is imported).
The simulator ignores streams, so this records them: each launch's configuration and each copy's
`stream` argument, and the priority each stage asked its stream for, while the three stages, opened
as the pipeline opens them with `gpu.stream_priority: low`, run a small batch each (their answers
checked against the CPU's).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "gpu"), str(ROOT)]

from numba import cuda  # noqa: E402
from numba.cuda.simulator import kernel as sim_kernel  # noqa: E402
from numba.cuda.simulator.cudadrv import devicearray as sim_array  # noqa: E402

import streamer_gpu  # noqa: E402
from streamer.pipeline.abea import AbeaReads, align_batch  # noqa: E402
from streamer.pipeline.events import DNA_PARAMS, detect_events  # noqa: E402
from streamer.pipeline.gpu import CudaOptions  # noqa: E402
from streamer.pore.model import load_default_models  # noqa: E402
from streamer_gpu import abea, events, streams  # noqa: E402
from streamer_plugins.cpg import hmm_cuda  # noqa: E402
from streamer_plugins.cpg.hmm import HmmInputs, HmmJobs, score_windows  # noqa: E402
from streamer_plugins.cpg.hmm_gpu import open_gpu_hmm  # noqa: E402

from cpg_model9 import cpg_model, synthetic_jobs  # noqa: E402
from gpu_cases import Batch, fixture_windows  # noqa: E402

uses: list[tuple[str, object]] = []  # (what, the stream it was given; None: the default stream)
asked: list[tuple[str, str]] = []  # (module, priority) of every stream a stage opened


def record() -> None:
    """Wrap the simulator's launch configuration, copies and `to_device`, and each stage's `open_stream`."""
    getitem = sim_kernel.FakeCUDAKernel.__getitem__

    def launch(self, configuration):
        uses.append((f"launch {self.fn.__name__}", configuration[2] if len(configuration) > 2 else None))
        return getitem(self, configuration)

    sim_kernel.FakeCUDAKernel.__getitem__ = launch
    for name in ("copy_to_device", "copy_to_host"):
        method = getattr(sim_array.FakeCUDAArray, name)

        def copy(self, *args, _method=method, _name=name, **kw):
            stream = kw.get("stream", args[1] if len(args) > 1 else None)
            uses.append((_name, stream or None))
            return _method(self, *args, **kw)

        setattr(sim_array.FakeCUDAArray, name, copy)
    to_device = cuda.to_device

    def to_device_recorded(ary, stream=0, *args, **kw):
        uses.append(("to_device", stream or None))
        return to_device(ary, stream, *args, **kw)

    cuda.to_device = to_device_recorded
    for module in (abea, events, hmm_cuda):

        def opened(priority="normal", _module=module.__name__):
            asked.append((_module, priority))
            return streams.open_stream(priority)

        module.open_stream = opened


def streams_of(stage, since: int) -> dict:
    """How the uses after `since` split: on the stage's stream, on another, on the default one."""
    got = uses[since:]
    return {"n": len(got), "on_stage_stream": sum(s is stage.stream for _, s in got),
            "elsewhere": sorted({what for what, s in got if s is not stage.stream})}  # fmt: skip


def main() -> int:
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # the simulator's -inf - -inf in the HMM
    record()
    low = CudaOptions(stream_priority="low", max_reads=16, max_bases=200_000, events=True)
    model = load_default_models()[0]
    out: dict = {"simulated": True}

    since = len(uses)
    gpu = streamer_gpu.open_gpu(low)
    windows = Batch(*(x[:2] for x in dataclasses.astuple(fixture_windows(model)))).arrays()
    cpu_status, gpu_status = windows[4].copy(), windows[4].copy()
    cpu = align_batch(AbeaReads(*windows[:4], cpu_status, *windows[5:]), model)
    got, stats = gpu.align(AbeaReads(*windows[:4], gpu_status, *windows[5:]), model)
    out["abea"] = streams_of(gpu, since) | {
        "same": all(np.array_equal(getattr(cpu, f), getattr(got, f), equal_nan=True) for f in cpu._fields)
        and np.array_equal(cpu_status, gpu_status), "n_gpu": stats.n_gpu}  # fmt: skip

    since = len(uses)
    detector = streamer_gpu.open_events(low)
    rng = np.random.default_rng(3)
    signals = [rng.normal(90, 8, n).astype(np.float32) for n in (40, 300, 0, 120)]
    off = np.zeros(len(signals) + 1, np.int64)
    np.cumsum([len(s) for s in signals], out=off[1:])
    signal = np.concatenate(signals)
    ev, ev_stats = detector.detect(signal, off, DNA_PARAMS)
    want = detect_events(signal, off, DNA_PARAMS)
    out["events"] = streams_of(detector, since) | {
        "same": all(np.array_equal(a, b) for a, b in zip(want, ev)), "on_gpu": ev_stats.on_gpu}  # fmt: skip

    since = len(uses)
    hmm = open_gpu_hmm(low)
    hmm.block = 32  # the simulator runs each thread in Python
    args = synthetic_jobs(cpg_model(9), np.random.default_rng(4))
    args = (*(a[:4] for a in args[:5]), *args[5:])
    ll_u, ll_m, hmm_stats = hmm.score(HmmJobs(*args[:5]), HmmInputs(*args[5:]))
    cpu_u, cpu_m = score_windows(*args)
    out["hmm"] = streams_of(hmm, since) | {
        "same": bool(np.array_equal(cpu_u.view(np.uint32), ll_u.view(np.uint32))
                     and np.array_equal(cpu_m.view(np.uint32), ll_m.view(np.uint32))),
        "n_gpu": hmm_stats.n_gpu}  # fmt: skip

    out["asked"] = sorted(set(asked))
    opened = streams.open_stream("low")
    out["low_stream"] = {"asked": opened.asked, "number": opened.number}
    try:
        streams.open_stream("urgent")
        out["bad_priority"] = None
    except ValueError as exc:
        out["bad_priority"] = str(exc)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
