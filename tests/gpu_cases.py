"""GPU ABEA against the CPU on fixture reads; run as a script in its own process.

tests/test_gpu_abea.py starts it with NUMBA_ENABLE_CUDASIM=1 (numba reads that variable
when it is first imported, so the simulator cannot be switched on inside the test
process), or without it where a GPU is present. It prints one JSON object: per case,
which outputs differ from the CPU's (none, if all is well) and the batch's measurements.

The simulator runs every thread as a Python thread and polls them at each barrier, so the
cases use short windows of the fixture reads: 100 k-mers from the middle of each read with
the events the CPU aligned to them, and the read's own scalings.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np

from streamer.pipeline.abea import AbeaReads, align_batch
from streamer.pipeline.gpu import CudaOptions
from streamer_gpu.abea import CudaAbea, Layout
from streamer_gpu.host import CPU, GPU, ULTRA, assign_reads, bytes_per_base
from streamer_gpu.target import SIMULATED
from streamer.pore.model import load_default_models
from streamer.skips import Skip

import reference_abea
from ecoli_reads import fixture_reads

WINDOW = 100


@dataclasses.dataclass
class Batch:
    seqs: list[str]
    means: list[np.ndarray]
    shift: list[float]
    scale: list[float]
    status: list[int]

    def arrays(self):
        seq = np.frombuffer("".join(self.seqs).encode(), dtype=np.uint8)
        seq_off = np.zeros(len(self.seqs) + 1, np.int64)
        np.cumsum([len(s) for s in self.seqs], out=seq_off[1:])
        ev_off = np.zeros(len(self.means) + 1, np.int64)
        np.cumsum([len(m) for m in self.means], out=ev_off[1:])
        ev_mean = np.concatenate(self.means).astype(np.float32)
        return (seq, seq_off, ev_mean, ev_off, np.array(self.status, np.int8), np.array(self.shift, np.float32),
                np.array(self.scale, np.float32))  # fmt: skip


def fixture_windows(model) -> Batch:
    """A window of WINDOW k-mers from the middle of each fixture read, with its aligned events."""
    seqs, means, shift, scale = fixture_reads(model)
    batch = Batch(seqs, means, list(shift), list(scale), [0] * len(seqs))
    seq, seq_off, ev_mean, ev_off, status, shift, scale = batch.arrays()
    aln = align_batch(AbeaReads(seq, seq_off, ev_mean, ev_off, status, shift, scale), model)
    out = Batch([], [], [], [], [])
    for i, s in enumerate(seqs):
        kmer = aln.aln_kmer[aln.aln_off[i] : aln.aln_off[i + 1]]
        event = aln.aln_event[aln.aln_off[i] : aln.aln_off[i + 1]]
        k0 = len(s) // 2
        sel = event[(kmer >= k0) & (kmer < k0 + WINDOW)]
        means = ev_mean[ev_off[i] : ev_off[i + 1]][sel.min() : sel.max() + 1]
        out.seqs.append(s[k0 : k0 + WINDOW + model.k - 1])
        out.means.append(means)
        out.shift.append(shift[i])
        out.scale.append(scale[i])
        out.status.append(0)
    return out


def compare(cpu, cpu_status, gpu, gpu_status) -> list[str]:
    """Names of the outputs that differ (floats bit for bit, nan equal to nan)."""
    diff = [f for f in cpu._fields if not np.array_equal(getattr(cpu, f), getattr(gpu, f), equal_nan=True)]
    return diff + ([] if np.array_equal(cpu_status, gpu_status) else ["status"])


def differs_from_reference(model, batch: Batch, aln, status) -> list[int]:
    """Reads whose pairs, emission sum, pair count or status differ from `reference_abea.align`."""
    out = []
    for i, (seq, means, shift, scale) in enumerate(zip(batch.seqs, batch.means, batch.shift, batch.scale)):
        ref = reference_abea.align(seq, means, shift, scale, model)
        pairs = list(zip(aln.aln_kmer[aln.aln_off[i] : aln.aln_off[i + 1]].tolist(),
                         aln.aln_event[aln.aln_off[i] : aln.aln_off[i + 1]].tolist()))  # fmt: skip
        failed = status[i] != 0
        if (pairs, aln.sum_emission[i], aln.n_aligned[i], failed) != (ref.pairs, ref.sum_emission, ref.n_aligned,
                                                                       ref.failed):  # fmt: skip
            out.append(i)
    return out


def run_case(model, batch: Batch, aligner: CudaAbea, reference: bool = False) -> dict:
    arrays = batch.arrays()
    cpu_status, gpu_status = arrays[4].copy(), arrays[4].copy()
    cpu = align_batch(AbeaReads(*arrays[:4], cpu_status, *arrays[5:]), model)
    gpu, stats = aligner.align(AbeaReads(*arrays[:4], gpu_status, *arrays[5:]), model)
    out = {"diff": compare(cpu, cpu_status, gpu, gpu_status), "status": cpu_status.tolist(),
           "stats": dataclasses.asdict(stats)}  # fmt: skip
    if reference:  # the GPU against the slow reference itself, not only against the CPU
        out["reference_diff"] = differs_from_reference(model, batch, gpu, gpu_status)
    return out


def crafted(windows: Batch) -> Batch:
    """One read for each rule of the split (expected owners: tests/test_gpu_abea.py CRAFTED_OWNERS)."""
    b = Batch([], [], [], [], [])

    def add(seqs, means, i, status=0):
        b.seqs.append("".join(seqs))
        b.means.append(np.concatenate(means))
        b.shift.append(windows.shift[i])
        b.scale.append(windows.scale[i])
        b.status.append(status)

    for i in range(5):  # the first two fill the tiny arena, the other three are memory-outs
        add(windows.seqs[i : i + 1], windows.means[i : i + 1], i)
    add(windows.seqs[5:7], windows.means[5:7], 5)  # long: over max_lf x the batch mean
    add(windows.seqs[4:8], windows.means[4:8], 4)  # ultra-long: over ultra_thresh
    add(windows.seqs[:1], [np.repeat(windows.means[0], 4)], 0)  # events per base over max_epk, under 15
    add(windows.seqs[1:2], [np.repeat(windows.means[1], 20)], 1)  # over-segmented: the CPU flags it
    add(windows.seqs[2:3], windows.means[2:3], 2, status=Skip.LOW_MAPQ)  # skipped before ABEA
    return b


def main() -> int:
    model = load_default_models()[0]
    windows = fixture_windows(model)
    layout = Layout(threads_per_read=4 if SIMULATED else 32, reads_per_block=1, block=2)
    results = {"simulated": SIMULATED}

    aligner = CudaAbea(CudaOptions(), layout=layout, arena_bytes=1 << 22)
    few = Batch(*(x[:4] for x in dataclasses.astuple(windows)))
    # and one read whose events belong elsewhere: it fails the emission QC
    few.seqs.append(windows.seqs[0])
    few.means.append(windows.means[3])
    few.shift.append(windows.shift[3])
    few.scale.append(windows.scale[3])
    few.status.append(0)
    results["windows"] = run_case(model, few, aligner, reference=True)

    batch = crafted(windows)
    opt = CudaOptions(max_lf=1.3, max_epk=5.0, ultra_thresh=300)
    arrays = batch.arrays()
    tiny = CudaAbea(opt, layout=layout, arena_bytes=int(2.5 * len(windows.seqs[0]) * bytes_per_base(2.0, 100)))
    a = tiny.arena
    owner, counts = assign_reads(arrays[1], arrays[3], arrays[4], model.k, 15.0, opt.max_lf, opt.max_epk,
                                 opt.ultra_thresh, a.bases, a.events, a.rows, a.reads)  # fmt: skip
    results["crafted"] = run_case(model, batch, tiny) | {
        "owner": [{CPU: "cpu", GPU: "gpu", ULTRA: "ultra"}[int(o)] for o in owner],
        "counts": counts[:3].tolist(),
    }

    # the tuner's avg-epk change: the same buffer divided anew, answers unchanged
    buffer, before = tiny.arena._buffer, [a.bases, a.events, a.rows, a.reads]
    tiny.retune(dataclasses.replace(opt, avg_epk=3.0))
    results["repartition"] = run_case(model, batch, tiny) | {
        "before": before, "after": [tiny.arena.bases, tiny.arena.events, tiny.arena.rows, tiny.arena.reads],
        "same_buffer": tiny.arena._buffer is buffer, "avg_epk": tiny.options.avg_epk,
    }

    class Broken:
        """A launch that fails as a device out of memory would."""

        def __getitem__(self, config):
            def launch(*args):
                from numba.cuda.cudadrv.driver import CudaAPIError

                raise CudaAPIError(2, "CUDA_ERROR_OUT_OF_MEMORY")

            return launch

    aligner._fill = Broken()
    results["fallback"] = run_case(model, few, aligner)
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
