"""`streamer call`: call CpG methylation once over finished files (like `f5c call-methylation`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from streamer.assemble import BatchLimits, UltraLong, plan_batches
from streamer.gpu_api import CudaOptions
from streamer.commands._inputs import (
    add_input_arguments,
    alignment_filter,
    model_files,
    signal_index,
)
from streamer.io.alignments import iter_alignments, write_records
from streamer.io.bamreads import open_basecalls
from streamer.io.reference import Reference
from streamer.overlap import IO_MODES, OverlapOptions, reader_pool, run_overlapped
from streamer.pipeline import BatchResult, Pipeline, PipelineOptions
from streamer_plugins.bedmethyl import BedMethyl
from streamer_plugins.modbam import ModCalls, write_modbam
from streamer.skips import Skipped
from streamer.summary import RunSummary
from streamer.tuning.session import CallTuning, add_call_arguments

NAME = "call"
HELP = "call CpG methylation on finished signal, basecall and alignment files"

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_arguments(p, "call-methylation TSV")
    p.add_argument("--bedmethyl", type=Path, metavar="FILE",
                   help="also write per-CpG, per-strand counts as bedMethyl (modkit)")
    p.add_argument("--modbam", type=Path, metavar="FILE",
                   help="also write the --bam alignments with the calls as MM/ML tags (modBAM)")
    p.add_argument("--stats-json", type=Path, help="also write the run summary as JSON to this file")
    p.add_argument("--meth-model", type=Path,
                   help="CpG methylation pore model file, nanopolish/f5c text, k up to 9 (default: r9.4 450bps 6-mer; "
                        "for R10.4.1 data f5c's CpG 9-mer model in the model folder, see --model-dir)")
    p.add_argument("--io-workers", type=int, default=OverlapOptions.io_workers,
                   help="signal readers working ahead of the stages [%(default)s]")
    p.add_argument("--io-mode", choices=IO_MODES, default=OverlapOptions.io_mode,
                   help="signal readers as processes or threads; auto: threads for SLOW5/BLOW5, processes "
                        "otherwise (FAST5 and POD5 readers hold a lock or the GIL) [%(default)s]")
    p.add_argument("--compute-threads", type=int, default=OverlapOptions.compute_threads,
                   help="batches in the stages at once, so CPU and GPU stages overlap [%(default)s]")
    gpu = p.add_argument_group("GPU (ABEA and the CpG HMM on an NVIDIA GPU when numba-cuda and a GPU are present)")
    gpu.add_argument("--disable-cuda", action="store_true", help="align and call on the CPU only")
    gpu.add_argument("--disable-cuda-hmm", action="store_true", help="run the CpG HMM on the CPU, ABEA on the GPU")
    gpu.add_argument("--cuda-dev-id", type=int, default=CudaOptions.dev_id, help="GPU to use [%(default)s]")
    gpu.add_argument("--cuda-mem-frac", type=float, default=CudaOptions.mem_frac,
                     help="fraction of free GPU memory to take [0.9; 0.7 on integrated GPUs]")
    gpu.add_argument("--cuda-avg-epk", type=float, default=CudaOptions.avg_epk,
                     help="events per base the GPU memory is divided for [%(default)s]")
    gpu.add_argument("--cuda-max-lf", type=float, default=CudaOptions.max_lf,
                     help="reads longer than this times the batch's mean length run on the CPU [%(default)s]")
    gpu.add_argument("--cuda-max-epk", type=float, default=CudaOptions.max_epk,
                     help="reads with more events per base than this run on the CPU [%(default)s]")
    gpu.add_argument("--ultra-thresh", type=int, default=CudaOptions.ultra_thresh,
                     help="with the GPU, reads longer than this are set aside and aligned on the CPU after all "
                          "the others [%(default)s]")
    gpu.add_argument("--skip-ultra", type=Path, metavar="FILE",
                     help="with the GPU, write the alignments of reads longer than --ultra-thresh to this BAM "
                          "instead of processing them")
    add_call_arguments(p)


def _report(skipped: list[Skipped], summary: RunSummary) -> None:
    for s in skipped:
        log.info("%s", s.message())
        summary.skip(s.reason)


def run(args: argparse.Namespace) -> int:
    tuning = CallTuning.from_args(args)
    limits = tuning.limits(BatchLimits(max_reads=args.batchsize, max_bases=args.max_bases))
    cuda = CudaOptions(disable=args.disable_cuda, dev_id=args.cuda_dev_id, mem_frac=args.cuda_mem_frac,
                       avg_epk=args.cuda_avg_epk, max_lf=args.cuda_max_lf, max_epk=args.cuda_max_epk,
                       ultra_thresh=args.ultra_thresh, max_reads=limits.max_reads, max_bases=limits.max_bases,
                       hmm=not args.disable_cuda_hmm)
    overlap = OverlapOptions(io_workers=max(1, args.io_workers), io_mode=args.io_mode,
                             compute_threads=max(1, args.compute_threads))
    filt = alignment_filter(args)
    summary = RunSummary()
    progress = sys.stderr.isatty()
    with ExitStack() as stack:
        index = signal_index(args)
        kmer_model, meth_model = model_files(args, index, methylation=True)
        options = PipelineOptions(threads=args.threads, kmer_model=kmer_model, meth_model=meth_model, cuda=cuda)
        # readers start while the pipeline loads its models and kernels
        pool = reader_pool(index, overlap.io_workers, overlap.io_mode)
        stack.callback(pool.shutdown, wait=True, cancel_futures=True)
        with ThreadPoolExecutor(1) as early:  # the reads file is indexed while the pipeline starts
            basecalls = early.submit(open_basecalls, args.reads)
            pipeline = Pipeline(options)
            tuning.attach(pipeline.gpu)
            summary.startup_s = summary.elapsed
            basecalls = stack.enter_context(basecalls.result())
        ref = stack.enter_context(Reference(args.genome))
        out = stack.enter_context(open(args.output, "w")) if args.output else sys.stdout
        out.write(Pipeline.TSV_HEADER)
        # as f5c does, ultra-long reads wait for the end of the run only when the GPU aligns the rest
        ultra = UltraLong(args.ultra_thresh, args.skip_ultra) if pipeline.gpu is not None else None
        plans = plan_batches(iter_alignments(args.bam, filt), basecalls, index, limits, str(args.reads), ultra)

        bed = BedMethyl() if args.bedmethyl else None
        mod = ModCalls() if args.modbam else None

        def on_result(result: BatchResult) -> None:
            tuning.observe(result.gpu_stats)
            if bed is not None:
                bed.add_calls(result.calls, result.ref_names)
            if mod is not None:
                mod.add_calls(result.calls, result.read_ids, result.ref_names)
            if progress:
                print(f"\r{summary.progress_line()}", end="", file=sys.stderr, flush=True)

        run_overlapped(pipeline, plans, ref, pool, out, summary, overlap, on_result,
                       lambda skipped: _report(skipped, summary))  # fmt: skip
        tuning.finish()
        if ultra is not None and ultra.skip_to is not None:
            write_records(args.bam, ultra.skip_to, ultra.skipped_ids, filt)
        if bed is not None:
            with open(args.bedmethyl, "w") as fh:
                bed.write(fh)
        if mod is not None:
            write_modbam(args.bam, args.modbam, mod, filt, " ".join(["streamer", *sys.argv[1:]]))
    if progress:
        print(file=sys.stderr)
    print(summary.report(), file=sys.stderr)
    if args.stats_json:
        args.stats_json.write_text(json.dumps({**summary.as_dict(), "tuning": tuning.summary()}, indent=2) + "\n")
    return 0
