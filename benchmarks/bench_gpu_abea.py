"""GPU ABEA against the CPU: exactness on the shared reads, stage timings, end-to-end `streamer call`.

1. Exactness: the 112 shared E. coli reads through events and scaling, then CPU ABEA and
   GPU ABEA in each launch layout; every output array and status must be bit-identical.
2. ABEA stage on the reads replicated in memory to at least --mbases: CPU ABEA on all
   threads against GPU ABEA per layout (packing, transfers, kernels, cells/s), each checked
   against the CPU answer.
3. `streamer call` with and without --disable-cuda: on the 112 reads, and on the reads
   replicated on disk (benchmarks/bench_call.py's replicate) to at least --mbases; outputs
   compared byte for byte, wall times reported.

    python benchmarks/bench_gpu_abea.py --data ../shared/data/ecoli_2kb_region --out bench-work/gpu
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import cuda

from streamer.pipeline.abea import AbeaReads, align_batch
from streamer.pipeline.batching import BatchLimits, offline_batches
from streamer.pipeline.batch import pack
from streamer.pipeline.events import detect_events
from streamer_gpu.abea import CudaAbea, Layout
from streamer.pipeline.gpu import CudaOptions
from streamer.io.alignments import AlignmentRecord, AlignmentFilter, iter_alignments
from streamer.io.fastx import load_basecalls
from streamer.io.index import open_index
from streamer.io.reference import Reference
from streamer.pore.model import load_default_models
from streamer.pipeline.scaling import estimate_scalings

sys.path.insert(0, str(Path(__file__).parent))
from bench_call import replicate  # noqa: E402
from common import STREAMER, gpu_rows, shared_data_parser, timed_call  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "ecoli_k12_mg1655.fa.gz"
LAYOUTS = [Layout(128, 1, 64), Layout(64, 1, 64), Layout(32, 1, 64), Layout(32, 2, 64), Layout(32, 4, 64),
           Layout(32, 8, 64), Layout(32, 4, 128)]  # fmt: skip


def scaled_batch(data: Path, work: Path, model):
    """The shared reads as one batch with events and method-of-moments scalings."""
    reads = work / "reads.fasta"
    if not reads.exists():
        reads.write_text((data / "reads.fasta").read_text())
    ref_path = work / "ref.fa"
    if not ref_path.exists():
        ref_path.write_bytes(gzip.decompress(REFERENCE.read_bytes()))
    bam = data / "reads.mg1655.sorted.bam"
    filt = AlignmentFilter()
    wanted = {a.read_id for a in iter_alignments(bam, filt) if isinstance(a, AlignmentRecord)}
    basecalls = load_basecalls(reads, wanted)
    index = open_index(reads, [data / "fast5_files"])
    with Reference(ref_path) as ref:
        batches = list(offline_batches(iter_alignments(bam, filt), basecalls, index, ref,
                                       BatchLimits(max_reads=10**6, max_bases=10**9), str(reads)))  # fmt: skip
    batch = pack([r for rs, _ in batches for r in rs])
    batch.ev_off, _, _, batch.ev_mean, _ = detect_events(batch.signal, batch.signal_off)
    batch.shift, batch.scale, _ = estimate_scalings(batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off,
                                                    batch.status, model)  # fmt: skip
    return (batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.status, batch.shift, batch.scale)


def replicated(arrays, copies: int):
    seq, seq_off, ev_mean, ev_off, status, shift, scale = arrays
    n = len(seq_off) - 1

    def offsets(off):
        out = np.zeros(n * copies + 1, np.int64)
        np.cumsum(np.tile(np.diff(off), copies), out=out[1:])
        return out

    return (np.tile(seq, copies), offsets(seq_off), np.tile(ev_mean, copies), offsets(ev_off), np.tile(status, copies),
            np.tile(shift, copies), np.tile(scale, copies))  # fmt: skip


def differences(a, a_status, b, b_status) -> list[str]:
    diff = [f for f in a._fields if not np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True)]
    return diff + ([] if np.array_equal(a_status, b_status) else ["status"])


def run_cpu(arrays, model):
    status = arrays[4].copy()
    t0 = time.perf_counter()
    aln = align_batch(AbeaReads(*arrays[:4], status, *arrays[5:]), model)
    return aln, status, time.perf_counter() - t0


def run_gpu(aligner: CudaAbea, arrays, model):
    status = arrays[4].copy()
    t0 = time.perf_counter()
    aln, stats = aligner.align(AbeaReads(*arrays[:4], status, *arrays[5:]), model)
    return aln, status, time.perf_counter() - t0, stats


def main() -> int:
    ap = shared_data_parser(__doc__, "bench-work/gpu")
    ap.add_argument("--mbases", type=float, default=60.0, help="replicate to at least this many Mbases")
    ap.add_argument("--reps", type=int, default=2, help="timed repeats of each ABEA run [%(default)s]")
    ap.add_argument("-K", type=int, default=4096, help="-K of the end-to-end runs [%(default)s]")
    ap.add_argument("-B", type=int, default=20_000_000, help="-B of the end-to-end runs [%(default)s]")
    ap.add_argument("--skip-call", action="store_true", help="ABEA only, no end-to-end runs")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    threads = numba.config.NUMBA_NUM_THREADS
    model = load_default_models()[0]
    res: dict = {"threads": threads, "cores": os.cpu_count()}

    base = scaled_batch(args.data, args.work, model)
    bases = int(base[1][-1])
    res["reads"], res["bases"] = len(base[1]) - 1, bases
    aligner = CudaAbea(CudaOptions())
    res["device"] = aligner.device_name
    res["arena"] = {"bytes": aligner.arena.n_bytes, "bases": aligner.arena.bases, "events": aligner.arena.events}
    cpu, cpu_status, _ = run_cpu(base, model)
    res["exact_shared"] = {}
    for layout in LAYOUTS:
        aligner.set_layout(layout)
        gpu, gpu_status, _, _ = run_gpu(aligner, base, model)
        res["exact_shared"][str(layout)] = differences(cpu, cpu_status, gpu, gpu_status)
    res["threading_layer"] = numba.threading_layer()
    res["pairs_shared"] = int(cpu.aln_off[-1])
    res["status_shared"] = {int(k): int(v) for k, v in zip(*np.unique(cpu_status, return_counts=True))}
    print("exact on shared reads:", res["exact_shared"], flush=True)

    copies = math.ceil(args.mbases * 1e6 / bases)
    big = replicated(base, copies)
    res["copies"], res["big_bases"], res["big_reads"] = copies, int(big[1][-1]), len(big[1]) - 1
    cpu_times = []
    for _ in range(2):
        cpu_big, cpu_big_status, t = run_cpu(big, model)
        cpu_times.append(t)
    res["cpu_abea_s"] = cpu_times
    print(f"CPU ABEA {copies} copies ({big[1][-1] / 1e6:.1f} Mbases): {cpu_times}", flush=True)
    res["gpu"] = {}
    for layout in LAYOUTS:
        aligner.set_layout(layout)
        runs = []
        for _ in range(args.reps):
            gpu, gpu_status, wall, stats = run_gpu(aligner, big, model)
            runs.append({"wall_s": wall, **dataclasses.asdict(stats)})
        exact = differences(cpu_big, cpu_big_status, gpu, gpu_status)
        res["gpu"][str(layout)] = {"runs": runs, "exact": exact}
        best = min(runs, key=lambda r: r["wall_s"])
        print(f"{layout}: stage {best['wall_s']:.3f} s kernels {best['t_kernels']:.3f} s exact {exact == []}",
              flush=True)  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(res, indent=2))
    del aligner
    gc.collect()
    cuda.close()  # give the arena back: each `streamer call` below takes its own

    if not args.skip_call:
        ref = args.work / "ref.fa"
        common = ["-b", str(args.data / "reads.mg1655.sorted.bam"), "-g", str(ref), "-t", str(threads),
                  "-r", str(args.work / "reads.fasta")]  # fmt: skip
        small = {}
        for label, extra in (("gpu", []), ("cpu", ["--disable-cuda"])):
            small[label] = timed_call([*common, "-o", str(args.work / f"small_{label}.tsv"), *extra],
                                args.work / f"small_{label}.log")  # fmt: skip
        res["call_shared_identical"] = (args.work / "small_gpu.tsv").read_bytes() == (
            args.work / "small_cpu.tsv").read_bytes()  # fmt: skip
        print("call on shared reads identical:", res["call_shared_identical"], flush=True)
        rep = args.work / f"x{copies}"
        if not (rep / "reads.bam.bai").exists():
            t0 = time.perf_counter()
            res["replicate"] = replicate(args.data, rep, copies)
            res["replicate_s"] = time.perf_counter() - t0
        subprocess.run([*STREAMER, "index", "-d", str(rep / "fast5"), str(rep / "reads.fasta")],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        big_common = ["-b", str(rep / "reads.bam"), "-g", str(ref), "-t", str(threads), "-r", str(rep / "reads.fasta"),
                      "-K", str(args.K), "-B", str(args.B)]  # fmt: skip
        res["call"] = {}
        for label, extra in (("gpu", []), ("cpu", ["--disable-cuda"])):
            stats_json = args.work / f"call_{label}.json"
            wall = timed_call([*big_common, "-o", str(args.work / f"call_{label}.tsv"), "--stats-json", str(stats_json),
                         *extra], args.out / f"call_{label}.log")  # fmt: skip
            res["call"][label] = {"wall_s": wall, **json.loads(stats_json.read_text())}
            print(f"call {label}: {wall:.1f} s", flush=True)
        res["call_identical"] = (args.work / "call_gpu.tsv").read_bytes() == (args.work / "call_cpu.tsv").read_bytes()
        print("call on replicated reads identical:", res["call_identical"], flush=True)
        (args.out / "results.json").write_text(json.dumps(res, indent=2))

    print(report(res))
    (args.out / "results.md").write_text(report(res) + "\n")
    return 0


def report(res: dict) -> str:
    mb = res["big_bases"] / 1e6
    cpu = min(res["cpu_abea_s"])
    lines = [f"{res['device']}, {res['cores']} cores, {res['threads']} threads; {mb:.1f} Mbases "
             f"({res['copies']} copies of {res['reads']} reads)", "",
             "| ABEA | stage s | pack s | H2D s | kernels s | D2H s | Gcells/s | vs CPU | exact |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| CPU, {res['threads']} threads | {cpu:.3f} | | | | | | 1.0x | reference |"]  # fmt: skip
    lines += gpu_rows(res["gpu"], cpu, "t_kernels", lambda g: "yes" if not g["exact"] else str(g["exact"]))
    lines += ["", f"shared reads exact per layout: {res['exact_shared']}"]
    if "call" in res:
        g, c = res["call"]["gpu"], res["call"]["cpu"]
        lines += ["", "| streamer call | wall s | ABEA s | HMM s | Mbases/s |", "|---|---|---|---|---|"]
        for label, r in (("GPU", g), ("CPU only", c)):
            st = r["stage_seconds"]
            lines.append(f"| {label} | {r['wall_s']:.1f} | {st.get('abea', 0):.2f} | {st.get('hmm', 0):.2f} | "
                         f"{r['bases'] / r['wall_s'] / 1e6:.2f} |")  # fmt: skip
        lines += ["", f"outputs identical: shared reads {res['call_shared_identical']}, "
                      f"replicated {res['call_identical']}"]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
