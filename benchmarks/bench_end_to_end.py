"""End-to-end `streamer call` with the GPU HMM and the overlapped pipeline, against CPU-only.

1. Exactness on the shared reads: `streamer call` with the GPU (ABEA and HMM), with GPU ABEA
   and the CPU HMM (--disable-cuda-hmm), and CPU only (--disable-cuda); TSVs compared byte
   for byte.
2. The HMM stage alone: every (read, window) job of the shared reads, tiled --copies times in
   memory, scored by the CPU `score_windows` on all threads and by the GPU in several launch
   settings; answers compared bit for bit, kernel, transfer and packing times.
3. The shared reads replicated --copies times with fresh read ids (11,700 alignments for 100
   copies: f5c's 66 Mbases) as single-read FAST5 files, and the same reads as POD5 and BLOW5
   files; `streamer call` timed end to end on each, GPU against CPU-only, every output
   compared with the FAST5 GPU run's.

Results go to OUT/results.json (rewritten after every step, so a run cut short keeps what it
measured) and OUT/results.md; each run's log to WORK/logs.

    python benchmarks/bench_end_to_end.py --data ../shared/data/ecoli_2kb_region --out bench-work/e2e
"""

from __future__ import annotations

import gc
import gzip
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numba
import numpy as np

from common import STREAMER, gpu_rows, new_id, replicate_bam, shared_data_parser
from streamer.io.fastx import load_basecalls
from streamer.pipeline.chunks import chunked

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "ecoli_k12_mg1655.fa.gz"
HMM_LAUNCHES = [(64, True), (128, True), (256, True), (128, False)]  # (block, costliest windows first)


def _copy_fast5(job: tuple[list[str], Path, int]) -> None:
    import h5py

    files, dst_dir, copy = job
    for f in files:
        dst = dst_dir / f"c{copy}_{Path(f).name}"
        shutil.copyfile(f, dst)
        with h5py.File(dst, "r+") as h:
            for grp in h["Raw/Reads"].values():
                grp.attrs["read_id"] = new_id(grp.attrs["read_id"].decode(), copy).encode()


def _write_copies(job: tuple[str, Path, list[int]]) -> None:
    """POD5 or BLOW5 file of the given copies of every shared read, with the source run's metadata."""
    from dataclasses import replace

    from streamer.io.fast5 import iter_fast5
    from streamer.io.pod5 import write_pod5
    from streamer.io.poretype import run_metadata
    from streamer.io.slow5 import write_blow5

    fmt, path, copies = job
    src = sorted(Path(os.environ["E2E_FAST5"]).glob("*.fast5"))
    records = [rec for f in src for rec in iter_fast5(f)]
    out = (replace(rec, read_id=new_id(rec.read_id, c)) for c in copies for rec in records)
    # the source run's flow cell and kit, as MinKNOW writes them into its own files: they name the pore
    (write_pod5 if fmt == "pod5" else write_blow5)(path, out, run_metadata(src[0]))


def replicate(data: Path, work: Path, copies: int, workers: int) -> dict:
    """FASTA, sorted BAM and single-read FAST5 copies in work/fast5; POD5 and BLOW5 copies beside."""
    t0 = time.perf_counter()
    seqs = load_basecalls(data / "reads.fasta")
    files = sorted(str(f) for f in (data / "fast5_files").glob("*.fast5"))
    for sub in ("fast5", "pod5", "blow5"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    os.environ["E2E_FAST5"] = str(data / "fast5_files")
    n_files = max(1, min(16, copies))
    groups = [list(range(i, copies, n_files)) for i in range(n_files)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        fast5 = [pool.submit(_copy_fast5, (files, work / "fast5", c)) for c in range(copies)]
        others = [pool.submit(_write_copies, (fmt, work / fmt / f"part{i}.{fmt}", g))
                  for fmt in ("pod5", "blow5") for i, g in enumerate(groups)]  # fmt: skip
        for f in fast5 + others:
            f.result()
    ids = [rid for rid in seqs]
    with open(work / "reads.fasta", "w") as fa:
        for c in range(copies):
            fa.writelines(f">{new_id(rid, c)}\n{seqs[rid]}\n" for rid in ids)
    records = replicate_bam(data / "reads.mg1655.sorted.bam", work / "reads.bam", copies, workers)
    for fmt in ("pod5", "blow5"):
        # the index is cached beside the reads file: one reads file per signal format
        (work / fmt / "reads.fasta").symlink_to(work / "reads.fasta")
        subprocess.run([*STREAMER, "index", "-d", str(work / fmt), str(work / fmt / "reads.fasta")],
                       check=True, capture_output=True)  # fmt: skip
    subprocess.run([*STREAMER, "index", "-d", str(work / "fast5"), str(work / "reads.fasta")],
                   check=True, capture_output=True)  # fmt: skip
    return {"copies": copies, "records": copies * len(records), "seconds": time.perf_counter() - t0}


def call(args: list[str], out: Path, log: Path, trace: Path | None = None) -> dict:
    """One `streamer call`: wall time, its stats JSON and the TSV's path (and its timeline, to `trace`)."""
    stats = out.with_suffix(".json")
    if trace is not None:
        args = [*args, "--trace", str(trace)]
    t0 = time.perf_counter()
    proc = subprocess.run([*STREAMER, "call", *args, "-o", str(out), "--stats-json", str(stats)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    t1 = time.perf_counter()
    log.write_text(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"streamer call {' '.join(args)} failed: {proc.stderr[-2000:]}")
    res = {"wall_s": t1 - t0, **json.loads(stats.read_text()), "tsv": str(out)}
    if trace is not None:  # its clock is this one (the system's monotonic clock): what lies outside its spans
        spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
        res["before_first_span_s"] = min(e["ts"] for e in spans) / 1e6 - t0
        res["after_last_span_s"] = t1 - max(e["ts"] + e["dur"] for e in spans) / 1e6
        res["launch_spans_s"] = {e["name"]: e["dur"] / 1e6 for e in spans if e["name"] in LAUNCH_SPANS}
    return res


# what `streamer call --trace` records before its first batch, in order (`streamer.commands.call`); the plan's
# wait holds "numba start" and "gpu probe", the start-up "devices" and "warm-up"
LAUNCH_SPANS = ("imports", "inputs", "index", "plan", "numba start", "gpu probe", "start-up", "devices", "warm-up")


def f5c_call(f5c: Path, rep: Path, ref: Path, threads: int, flags: list[str], log: Path) -> dict:
    """f5c call-methylation on the replicated reads as one BLOW5: wall time, peak summed PSS, its TSV."""
    from streamer.summary import tree_pss

    d = rep / "f5c"
    d.mkdir(exist_ok=True)
    blow5, reads = d / "reads.blow5", d / "reads.fasta"
    if not blow5.exists():  # f5c 1.1 reads one BLOW5
        from streamer.io.slow5 import iter_slow5, write_blow5

        parts = sorted((rep / "blow5").glob("*.blow5"))
        write_blow5(blow5, (rec for part in parts for rec in iter_slow5(part)), threads=os.cpu_count() or 1)
        shutil.copyfile(rep / "reads.fasta", reads)
        subprocess.run([str(f5c), "index", "--slow5", str(blow5), str(reads)], check=True, capture_output=True)
    out = d / "calls.tsv"
    cmd = [str(f5c), "call-methylation", "-t", str(threads), *flags, "-r", str(reads), "-b", str(rep / "reads.bam"),
           "-g", str(ref), "--slow5", str(blow5)]  # fmt: skip
    peak = 0
    t0 = time.perf_counter()
    with open(out, "w") as stdout, open(log, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr)
        while proc.poll() is None:
            peak = max(peak, tree_pss(proc.pid))
            time.sleep(0.05)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {log.read_text()[-2000:]}")
    return {"wall_s": wall, "peak_memory_mb": peak / 2**20, "command": " ".join(cmd), "tsv": str(out)}


def row_differences(a: Path, b: Path) -> dict:
    """Two call TSVs compared row by row in any order: rows each, rows of one not in the other, and
    how many of those differ only in a printed log-likelihood (same site, read and ratio)."""
    ra, rb = Counter(a.read_text().splitlines()), Counter(b.read_text().splitlines())
    only_a, only_b = ra - rb, rb - ra

    def key(row: str) -> tuple:
        f = row.split("\t")
        return (*f[:6], *f[8:])  # all but the two log-likelihoods

    return {"rows": [sum(ra.values()), sum(rb.values())], "differing": sum(only_a.values()),
            "differing_only_in_a_log_likelihood": sum((Counter(map(key, only_a.elements()))
                                                       & Counter(map(key, only_b.elements()))).values())}


def hmm_stage(data: Path, work: Path, ref_path: Path, copies: int, reps: int) -> dict:
    """CPU against GPU `score_windows` on the shared reads' jobs tiled `copies` times."""
    from streamer.pipeline.batching import BatchLimits, offline_batches
    from streamer.pipeline.batch import pack
    from streamer.pipeline.gpu import CudaOptions
    from streamer_plugins.cpg.hmm_cuda import CudaHmm
    from streamer.io.alignments import AlignmentRecord, AlignmentFilter, iter_alignments
    from streamer.io.fastx import load_basecalls
    from streamer.io.index import open_index
    from streamer.io.reference import Reference
    from streamer.pipeline.stages import Pipeline, PipelineOptions
    from streamer_plugins.cpg.caller import CpgCaller
    from streamer_plugins.cpg.hmm import HmmInputs, HmmJobs, score_windows

    class Recorder:
        def score(self, jobs, inputs):
            self.args = (*jobs, *inputs)
            return (*score_windows(*self.args), None)

    bam = data / "reads.mg1655.sorted.bam"
    filt = AlignmentFilter()
    wanted = {a.read_id for a in iter_alignments(bam, filt) if isinstance(a, AlignmentRecord)}
    with Reference(ref_path) as ref:
        batches = list(offline_batches(iter_alignments(bam, filt), load_basecalls(work / "reads.fasta", wanted),
                                       open_index(work / "reads.fasta"), ref, BatchLimits(10**6, 10**10)))  # fmt: skip
    pipeline = Pipeline(PipelineOptions(cuda=CudaOptions(disable=True)), [CpgCaller()])
    pipeline.analysis("hmm").gpu = recorder = Recorder()
    pipeline.run_batch(pack([r for rs, _ in batches for r in rs]))
    job_read, w0, w1, e1, e2, ref_seq, ref_off, rc, ev, ev_off, sc, epb, k, model, params, table = recorder.args
    n = len(rc)

    def offsets(off):
        out = np.zeros(n * copies + 1, np.int64)
        np.cumsum(np.tile(np.diff(off), copies), out=out[1:])
        return out

    args = (np.concatenate([job_read + c * n for c in range(copies)]), np.tile(w0, copies), np.tile(w1, copies),
            np.tile(e1, copies), np.tile(e2, copies), np.tile(ref_seq, copies), offsets(ref_off), np.tile(rc, copies),
            np.tile(ev, copies), offsets(ev_off), np.tile(sc, (copies, 1)), np.tile(epb, copies), k, model, params,
            table)  # fmt: skip
    res: dict = {"jobs": len(args[0]), "copies": copies}
    from numba import cuda

    res["device"] = cuda.get_current_device().name.decode() if hasattr(cuda.get_current_device().name, "decode") \
        else str(cuda.get_current_device().name)  # fmt: skip
    cpu = []
    for _ in range(reps):
        t0 = time.perf_counter()
        cpu_u, cpu_m = score_windows(*args)
        cpu.append(time.perf_counter() - t0)
    res["cpu_s"] = cpu
    res["gpu"] = {}
    for block, by_cost in HMM_LAUNCHES:
        hmm = CudaHmm(block=block, by_cost=by_cost)
        runs = []
        for _ in range(reps + 1):  # the first launch loads the kernel
            t0 = time.perf_counter()
            ll_u, ll_m, stats = hmm.score(HmmJobs(*args[:5]), HmmInputs(*args[5:]))
            runs.append({"wall_s": time.perf_counter() - t0, **stats.__dict__})
        diff = int(np.count_nonzero(ll_u.view(np.uint32) != cpu_u.view(np.uint32)))
        diff += int(np.count_nonzero(ll_m.view(np.uint32) != cpu_m.view(np.uint32)))
        res["gpu"][f"block {block}, {'costliest first' if by_cost else 'job order'}"] = {"runs": runs[1:], "diff": diff}
        del hmm
    # what moving event detection to the GPU would cost first: the batch's pA signal, host to device
    # (f5c's 66 Mbases are about 590 M samples)
    signal = np.ones(int(8.9 * 6.6e7), np.float32)
    pinned = cuda.pinned_array(signal.shape, np.float32)
    pinned[:] = signal
    res["signal_h2d_s"] = {}
    for label, host in (("pageable", signal), ("pinned", pinned)):
        t0 = time.perf_counter()
        dev = cuda.to_device(host)
        cuda.synchronize()
        res["signal_h2d_s"][label] = time.perf_counter() - t0
        del dev
    res["signal_gb"] = signal.nbytes / 1e9
    del pinned
    gc.collect()
    cuda.close()  # give the device memory back before the `streamer call` runs
    return res


def signal_stages(data: Path, ref_path: Path, reads: Path, copies: int) -> dict:
    """Event detection and scaling on CPU threads over the shared reads tiled `copies` times, in memory:
    what moving them to the GPU could save at most, against what the signal's copy there costs."""
    from streamer.pipeline.batching import BatchLimits, offline_batches
    from streamer.pipeline.batch import pack
    from streamer.pipeline.events import detect_events
    from streamer.io.alignments import AlignmentRecord, AlignmentFilter, iter_alignments
    from streamer.io.fastx import load_basecalls
    from streamer.io.index import open_index
    from streamer.io.reference import Reference
    from streamer.pore.model import load_default_models
    from streamer.pipeline.scaling import estimate_scalings

    bam = data / "reads.mg1655.sorted.bam"
    filt = AlignmentFilter()
    wanted = {a.read_id for a in iter_alignments(bam, filt) if isinstance(a, AlignmentRecord)}
    with Reference(ref_path) as ref:
        batches = list(offline_batches(iter_alignments(bam, filt), load_basecalls(reads, wanted), open_index(reads),
                                       ref, BatchLimits(10**6, 10**10)))  # fmt: skip
    b = pack([r for rs, _ in batches for r in rs])
    n = b.n

    def offsets(off):
        out = np.zeros(n * copies + 1, np.int64)
        np.cumsum(np.tile(np.diff(off), copies), out=out[1:])
        return out

    signal, signal_off = np.tile(b.signal, copies), offsets(b.signal_off)
    seq, seq_off = np.tile(b.seq, copies), offsets(b.seq_off)
    status = np.zeros(n * copies, np.int8)
    model = load_default_models()[0]
    res: dict = {"samples": len(signal), "bases": len(seq)}
    for threads in (numba.config.NUMBA_NUM_THREADS, max(1, numba.config.NUMBA_NUM_THREADS // 2)):
        numba.set_num_threads(threads)
        detect_events(signal[: signal_off[n]], signal_off[: n + 1])  # loads the kernel
        t0 = time.perf_counter()
        with chunked(1):
            ev_off, _, _, ev_mean, _ = detect_events(signal, signal_off)
        t1 = time.perf_counter()
        estimate_scalings(seq, seq_off, ev_mean, ev_off, status, model)
        res[f"threads_{threads}"] = {"events_s": t1 - t0, "scaling_s": time.perf_counter() - t1}
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    return res


def main() -> int:
    ap = shared_data_parser(__doc__, "bench-work/e2e")
    ap.add_argument("--copies", type=int, default=100, help="replicas of the shared reads [%(default)s]")
    ap.add_argument("--reps", type=int, default=1, help="timed repeats of the HMM stage [%(default)s]")
    ap.add_argument("--runs", default="all", help="comma-separated end-to-end runs (names in `runs`) [all]")
    ap.add_argument("--steps", default="shared,hmm_stage,signal_stages,calls", help="steps to run [%(default)s]")
    ap.add_argument("--trace-dir", type=Path, help="write each end-to-end run's timeline (`--trace`) here")
    ap.add_argument("--f5c", type=Path, help="also time this f5c binary's call-methylation on the replicated reads "
                                             "(one BLOW5), after the streamer runs")  # fmt: skip
    ap.add_argument("--f5c-flags", default="-K 2048 -B 20M", help="f5c's batch flags [%(default)s]")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.trace_dir:
        args.trace_dir.mkdir(parents=True, exist_ok=True)
    logs = args.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    threads = numba.config.NUMBA_NUM_THREADS
    res: dict = {"threads": threads, "cores": os.cpu_count(), "errors": {}}

    def save() -> None:
        (args.out / "results.json").write_text(json.dumps(res, indent=2))
        (args.out / "results.md").write_text(report(res) + "\n")

    def step(name: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            got = fn()
            if got is not None:
                res[name] = got
        except Exception:
            res["errors"][name] = traceback.format_exc()[-3000:]
            print(f"{name} failed:\n{res['errors'][name]}", flush=True)
        print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
        save()

    ref = args.work / "ref.fa"
    if not ref.exists():
        ref.write_bytes(gzip.decompress(REFERENCE.read_bytes()))
    shared = args.work / "shared"
    shared.mkdir(exist_ok=True)
    reads = shared / "reads.fasta"
    if not reads.exists():
        reads.write_text((args.data / "reads.fasta").read_text())
    small = ["-r", str(reads), "-b", str(args.data / "reads.mg1655.sorted.bam"), "-g", str(ref), "-t", str(threads),
             "--signal", str(args.data / "fast5_files")]  # fmt: skip

    def exact_shared() -> dict:
        out = {label: call([*small, *extra], shared / f"{label}.tsv", logs / f"shared_{label}.log")
               for label, extra in (("gpu", []), ("gpu_abea_cpu_hmm", ["--disable-cuda-hmm"]),
                                    ("cpu", ["--disable-cuda"]))}  # fmt: skip
        ref_tsv = Path(out["cpu"]["tsv"]).read_bytes()
        for r in out.values():
            r["identical_to_cpu"] = Path(r["tsv"]).read_bytes() == ref_tsv
        return out

    steps = args.steps.split(",")
    if "shared" in steps:
        step("shared", exact_shared)
    if "hmm_stage" in steps:
        step("hmm_stage", lambda: hmm_stage(args.data, shared, ref, args.copies, args.reps))
    if "signal_stages" in steps:
        step("signal_stages", lambda: signal_stages(args.data, ref, reads, args.copies))
    if "calls" not in steps:
        print(report(res))
        return 0
    rep = args.work / f"x{args.copies}"
    if not (rep / "reads.bam.bai").exists():
        shutil.rmtree(rep, ignore_errors=True)
        rep.mkdir(parents=True)
        step("replicate", lambda: replicate(args.data, rep, args.copies, os.cpu_count() or 1))
    big = ["-b", str(rep / "reads.bam"), "-g", str(ref), "-t", str(threads)]
    fast5, pod5, blow5 = (["-r", str(rep / sub / "reads.fasta")] for sub in (".", "pod5", "blow5"))
    runs = {  # batch caps from the device profile (on 16 cores and a data-centre GPU: -K 4096 -B 20000000) unless named
        "fast5_gpu": fast5,
        "fast5_gpu_K512_B2.5M": [*fast5, "-K", "512", "-B", "2500000"],
        "fast5_gpu_K1024": [*fast5, "-K", "1024"],
        "fast5_gpu_K2048_B10M": [*fast5, "-K", "2048", "-B", "10000000"],
        "fast5_gpu_K1024_c1": [*fast5, "-K", "1024", "--compute-threads", "1"],
        "fast5_gpu_K1024_c3": [*fast5, "-K", "1024", "--compute-threads", "3"],
        "fast5_gpu_K1024_t8": [*fast5, "-K", "1024", "-t", "8"],
        "fast5_gpu_K1024_io8": [*fast5, "-K", "1024", "--io-workers", "8"],
        "fast5_gpu_K1024_io24": [*fast5, "-K", "1024", "--io-workers", "24"],
        "fast5_gpu_K1024_mem0.1": [*fast5, "-K", "1024", "--cuda-mem-frac", "0.1"],
        "fast5_gpu_abea_cpu_hmm_K1024": [*fast5, "-K", "1024", "--disable-cuda-hmm"],
        "fast5_cpu_K1024": [*fast5, "-K", "1024", "--disable-cuda"],
        "pod5_gpu_cuda_events": [*pod5, "--cuda-events"],
        "pod5_gpu_budget_8G": [*pod5, "--memory-budget", "8G"],
        "pod5_gpu_budget_5G": [*pod5, "--memory-budget", "5G"],
        "pod5_gpu_budget_8G_K1024": [*pod5, "--memory-budget", "8G", "-K", "1024"],
        "pod5_gpu_budget_8G_K1024_c3": [*pod5, "--memory-budget", "8G", "-K", "1024", "--compute-threads", "3"],
        "pod5_gpu_c3": [*pod5, "--compute-threads", "3"],
        "pod5_gpu_c4": [*pod5, "--compute-threads", "4"],
        **{f"{fmt}_gpu{sfx}": [*r, *caps] for fmt, r in (("pod5", pod5), ("blow5", blow5))
           for sfx, caps in (("", []), ("_K1024", ["-K", "1024"]),
                             ("_K1024_threads", ["-K", "1024", "--io-mode", "threads"]),
                             ("_K1024_procs", ["-K", "1024", "--io-mode", "processes"]))},
    }
    # NAME*N repeats a run N times; repeats go round-robin, so drift spreads over every run alike
    chosen = [(name, int(n or 1)) for name, _, n in (r.partition("*") for r in args.runs.split(","))] \
        if args.runs != "all" else [(name, 1) for name in runs]  # fmt: skip
    res.setdefault("calls", {})
    reference_tsv = None
    for rep_no in range(max(n for _, n in chosen)):
        for label, n in chosen:
            if rep_no >= n:
                continue

            def one(label=label) -> None:
                trace = args.trace_dir / f"{label}.{rep_no}.trace.json" if args.trace_dir else None
                r = call([*big, *runs[label]], args.work / f"{label}.tsv", logs / f"{label}.{rep_no}.log", trace)
                nonlocal reference_tsv
                reference_tsv = reference_tsv or Path(r["tsv"]).read_bytes()
                r["identical"] = Path(r["tsv"]).read_bytes() == reference_tsv
                res["calls"].setdefault(label, []).append(r)
                print(f"{label}: {r['wall_s']:.2f} s, {r['bases'] / r['wall_s'] / 1e6:.2f} Mbases/s, identical "
                      f"{r['identical']}", flush=True)  # fmt: skip

            step(f"call_{label}_{rep_no}", one)
    if args.f5c:
        def f5c_run() -> dict:
            r = f5c_call(args.f5c, rep, ref, threads, args.f5c_flags.split(), logs / "f5c.log")
            if res["calls"]:
                r["rows_against_streamer"] = row_differences(
                    Path(r["tsv"]), next(Path(x["tsv"]) for rs in res["calls"].values() for x in rs))
            return r

        step("f5c", f5c_run)
    print(report(res))
    return 0


def report(res: dict) -> str:
    device = res.get("hmm_stage", {}).get("device", "")
    lines = [f"{device}, {res['cores']} cores, {res['threads']} threads", ""]
    if "shared" in res:
        lines.append("shared reads, identical to CPU-only: "
                     + ", ".join(f"{k} {v['identical_to_cpu']}" for k, v in res["shared"].items()))  # fmt: skip
    if "hmm_stage" in res:
        h = res["hmm_stage"]
        cpu = min(h["cpu_s"])
        lines += ["", f"HMM stage, {h['jobs']} windows ({h['copies']} copies)", "",
                  "| HMM | total s | pack s | H2D s | kernel s | D2H s | Gcells/s | vs CPU | differing |",
                  "|---|---|---|---|---|---|---|---|---|",
                  f"| CPU, {res['threads']} threads | {cpu:.3f} | | | | | | 1.0x | reference |"]  # fmt: skip
        lines += gpu_rows(h["gpu"], cpu, "t_kernel", lambda g: str(g["diff"]))
        if "signal_h2d_s" in h:
            lines += ["", f"signal {h['signal_gb']:.2f} GB to the GPU: " + ", ".join(
                f"{k} {v:.3f} s" for k, v in h["signal_h2d_s"].items())]  # fmt: skip
    if "signal_stages" in res:
        sg = res["signal_stages"]
        lines += ["", f"event detection and scaling on the CPU, {sg['samples'] / 1e6:.0f} M samples, "
                  f"{sg['bases'] / 1e6:.1f} Mbases: " + ", ".join(
                      f"{k.replace('_', ' ')}: events {v['events_s']:.2f} s, scaling {v['scaling_s']:.2f} s"
                      for k, v in sg.items() if k.startswith("threads"))]  # fmt: skip
    if res.get("calls"):
        stages = sorted({k for rs in res["calls"].values() for r in rs for k in r["stage_seconds"]})
        lines += ["", "Median run of each (all runs' walls in brackets); stage times summed over batches.", "",
                  "| streamer call | wall s | in-run s | start-up s | Mbases/s | identical | " + " | ".join(stages)
                  + " | waits |", "|---" * (len(stages) + 7) + "|"]  # fmt: skip
        for label, rs in res["calls"].items():
            r = sorted(rs, key=lambda r: r["wall_s"])[(len(rs) - 1) // 2]
            walls = " (" + ", ".join(f"{x['wall_s']:.2f}" for x in rs) + ")" if len(rs) > 1 else ""
            st = r["stage_seconds"]
            waits = ", ".join(f"{k} {v:.2f}" for k, v in r.get("waits_s", {}).items())
            if "before_first_span_s" in r:
                spans = r.get("launch_spans_s", {})
                waits += f"; launch {r['before_first_span_s']:.2f}, " + "".join(
                    f"{k} {spans[k]:.2f}, " for k in LAUNCH_SPANS if k in spans) + f"exit {r['after_last_span_s']:.2f}"
            lines.append(f"| {label} | {r['wall_s']:.2f}{walls} | {r['elapsed_s']:.2f} | {r['startup_s']:.2f} | "
                         f"{r['bases'] / r['wall_s'] / 1e6:.2f} "
                         f"| {all(x['identical'] for x in rs)} | " + " | ".join(f"{st.get(k, 0):.2f}" for k in stages)
                         + f" | {waits} |")  # fmt: skip
    if "f5c" in res:
        f = res["f5c"]
        lines += ["", f"f5c: {f['wall_s']:.2f} s, peak {f['peak_memory_mb']:.0f} MB (summed PSS), rows against "
                  f"streamer's: {f.get('rows_against_streamer')}; `{f['command']}`"]
        for label, rs in res.get("calls", {}).items():
            r = sorted(rs, key=lambda r: r["wall_s"])[(len(rs) - 1) // 2]
            lines.append(f"- {label}: {f['wall_s'] / r['wall_s']:.2f}x f5c, peak {r.get('peak_memory_mb', 0):.0f} MB")
    if res["errors"]:
        lines += ["", "errors: " + ", ".join(res["errors"])]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
