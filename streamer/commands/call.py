"""`streamer call`: call methylation once over finished files (like `f5c call-methylation`; `--methylation`
gpc, dam or dcm as `nanopolish call-methylation -q`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from streamer.pipeline import timeline
from streamer.pipeline.batching import RAMP, BatchLimits, UltraLong, plan_batches
from streamer.errors import UsageError
from streamer.commands._checks import numeric, removed_on_failure
from streamer.pipeline.gpu import CudaOptions, device_spec
from streamer.commands._inputs import (
    add_input_arguments,
    add_memory_argument,
    alignment_filter,
    alignments,
    open_read_aligner,
    size_arg,
    check_inputs,
    open_host,
    pipeline_options,
    readers_early,
    runner_options,
    signal_index,
)
from streamer.io.alignments import AlignmentFilter, AlignmentRecord, write_records
from streamer.io.bamreads import open_basecalls
from streamer.io.index import SignalIndex
from streamer.io.signal import reader_libraries
from streamer.pipeline.planned import run_batches
from streamer.pipeline.runner import RunnerOptions
from streamer.pipeline.steps import Done, Stages
from streamer.pipeline.stages import PipelineOptions
from streamer.pipeline.parsing import ParseProcess
from streamer.pipeline.chemistry import default_models
from streamer.pore.motifs import CPG, MOTIFS
from streamer.pipeline.resume import CallJournal, Resumed, journal_path, run_identity
from streamer.pipeline.signal_pool import IO_MODES, reader_mode
import streamer
from streamer import registry
from streamer.config import Config, OutputConfig, PipelineConfig
from streamer.sinks import Sink, SinkContext, open_sinks, row_sinks
from streamer.skips import Skipped, log_skipped
from streamer.summary import RunSummary
from streamer.tuning.profiles import MemoryPlan, budget_bytes, memory_plan
from streamer.tuning.session import CallTuning, add_call_arguments, first_gpu, probe_ahead

NAME = "call"
HELP = "call CpG (or GpC, dam, dcm) methylation on finished signal, basecall and alignment files"

if TYPE_CHECKING:  # imported where a run without -b needs an aligner (`open_read_aligner`)
    from streamer.align.engine import SeedAligner
    from streamer.daemon.aligner import ReadAligner

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_arguments(p, "call-methylation TSV", align=True)
    p.add_argument("--bedmethyl", type=Path, metavar="FILE",
                   help="also write per-CpG, per-strand counts as bedMethyl (modkit)")
    p.add_argument("--modbam", type=Path, metavar="FILE",
                   help="also write the --bam alignments with the calls as MM/ML tags (modBAM)")
    p.add_argument("--sink", action="append", default=[], metavar="NAME",
                   help="also write the output of the installed `streamer.sinks` plugin NAME (repeatable; the "
                        "daemon's output.sinks), in the folder of -o (or the working directory)")
    p.add_argument("--stats-json", type=Path, help="also write the run summary as JSON to this file")
    p.add_argument("--trace", type=Path, metavar="FILE",
                   help="also write the run's timeline (each batch's reading, stages and writing, by thread) as a "
                        "Chrome trace, for Perfetto or chrome://tracing")
    p.add_argument("-q", "--methylation", choices=tuple(MOTIFS), default=CPG.name,
                   help="the motif to call, as nanopolish's: cpg, gpc (GpC), dam (GATC), dcm (CCWGG) [%(default)s]")
    p.add_argument("--meth-model", type=Path,
                   help="methylation pore model file of the --methylation motif, nanopolish/f5c text, k up to 9 "
                        f"(default: {default_models()})")
    numeric(p, "--io-workers", type=int, minimum=1, default=RunnerOptions.io_workers,
            help="signal readers working ahead of the stages [%(default)s]")
    p.add_argument("--io-mode", choices=IO_MODES, default=RunnerOptions.io_mode,
                   help="signal readers as processes or threads; auto: processes, threads under a memory budget "
                        "below 1G (reader threads hold a lock or the GIL from the stages) [%(default)s]")
    numeric(p, "--compute-threads", type=int, minimum=1, default=RunnerOptions.compute_threads,
            help="batches in the stages at once, so CPU and GPU stages overlap; each has a lane of its own on a GPU "
                 "(an arena, buffers and a stream) [%(default)s]")
    add_memory_argument(p)
    gpu = p.add_argument_group("GPU (ABEA and the CpG HMM on an NVIDIA GPU when numba-cuda and a GPU are present)")
    gpu.add_argument("--disable-cuda", action="store_true", help="align and call on the CPU only")
    gpu.add_argument("--disable-cuda-hmm", action="store_true", help="run the CpG HMM on the CPU, ABEA on the GPU")
    gpu.add_argument("--cuda-events", action="store_true",
                     help="detect events on the GPU too (the same events), ahead of the GPU stages, leaving the host's "
                          "cores to the rest (the daemon's default with the workstation and hpc profiles)")
    gpu.add_argument("--cuda-dev-id", type=device_spec, default=str(CudaOptions.dev_id),
                     help="GPU to use, a list of them (0,1) or all: batches go to the least loaded [%(default)s]")
    numeric(gpu, "--cuda-mem-frac", key="gpu.mem_frac", default=CudaOptions.mem_frac,
            help="most of the free GPU memory to take; the arena is sized for the batches "
                 "[0.9; 0.7 on integrated GPUs]")
    numeric(gpu, "--cuda-avg-epk", key="gpu.avg_epk", default=CudaOptions.avg_epk,
            help="events per base the GPU memory is divided for [%(default)s]")
    numeric(gpu, "--cuda-max-lf", key="gpu.max_lf", default=CudaOptions.max_lf,
            help="reads longer than this times the batch's mean length run on the CPU [%(default)s]")
    numeric(gpu, "--cuda-max-epk", key="gpu.max_epk", default=CudaOptions.max_epk,
            help="reads with more events per base than this run on the CPU [%(default)s]")
    numeric(gpu, "--ultra-thresh", key="gpu.ultra_thresh", default=CudaOptions.ultra_thresh,
            help="with the GPU, reads longer than this are set aside and aligned on the CPU after all the others "
                 "[%(default)s]")
    gpu.add_argument("--skip-ultra", type=Path, metavar="FILE",
                     help="with the GPU, write the alignments of reads longer than --ultra-thresh to this BAM "
                          "instead of processing them")
    gpu.add_argument("--gpu-reserve", type=size_arg, default="auto", metavar="SIZE",
                     help="device memory never taken (2G), e.g. a live basecaller's on the same GPU; --cuda-mem-frac "
                          "applies to the free memory less it [auto: the device profile's, 0 but on a Jetson]")
    gpu.add_argument("--gpu-memory", type=size_arg, metavar="SIZE",
                     help="most device memory to take (arena, HMM, kernel modules) [--cuda-mem-frac alone; on a "
                          "Jetson the share of --memory-budget the host part leaves]")
    gpu.add_argument("--gpu-stream-priority", choices=("auto", "normal", "low"), default="auto",
                     help="priority of the CUDA streams the GPU stages run on; low leaves the GPU first to another "
                          "process's higher-priority streams [auto: the device profile's, low on a Jetson]")
    add_call_arguments(p)
    scale = p.add_argument_group("beyond this host, and starting again")
    scale.add_argument("--dask", metavar="ADDRESS",
                       help="run the batches on a Dask cluster: a scheduler's tcp://HOST:8786, or local[:N] for N "
                            "worker processes here; workers read the inputs from a shared filesystem "
                            "(install streamer[cluster])")
    scale.add_argument("--resume", action="store_true",
                       help="with -o FILE: keep the batches a killed run already wrote (journaled in FILE.journal) "
                            "and compute only the rest")


OUTPUTS = ("output", "bedmethyl", "modbam", "stats_json", "skip_ultra", "trace")


def run(args: argparse.Namespace) -> int:
    _check_combinations(args)
    probed = None if args.disable_cuda else probe_ahead(first_gpu(args))  # while the inputs are checked and indexed
    if args.trace:  # from the package's import on: what comes before the first batch, too
        timeline.start()
        timeline.record("imports", streamer.IMPORTED, time.perf_counter())
    with timeline.span("inputs"):
        check_inputs(args, *OUTPUTS)
    compiling = getattr(args, "compiling_kernels", False)  # announced by streamer.cli before the imports
    journal = journal_path(args.output) if args.output is not None else None
    with _ends_on_ctrl_c(args, journal is not None and not args.autotune):
        with removed_on_failure(*(getattr(args, name) for name in OUTPUTS), journal):
            return _run(args, compiling, probed)


@contextmanager
def _ends_on_ctrl_c(args: argparse.Namespace, resumable: bool) -> Iterator[None]:
    """Ctrl-C ends the run at once with one line (exit 130), as a kill would: the journal holds the
    batches written, which `--resume` goes on from. A KeyboardInterrupt raised wherever the main
    thread happens to be would be swallowed by a compiler callback or turned into another error
    inside a kernel; STREAMER_DEBUG=1 keeps it, for its traceback."""
    if os.environ.get("STREAMER_DEBUG") or threading.current_thread() is not threading.main_thread():
        yield
        return
    line = "streamer call: interrupted"
    if resumable:
        line += f"; the batches written to {args.output} are kept: the same command with --resume goes on from them"

    def stop(*_) -> None:
        print(line, file=sys.stderr, flush=True)
        os._exit(130)

    old = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _run(args: argparse.Namespace, compiling: bool, probed: Future | None) -> int:
    with timeline.span("index"):
        index = signal_index(args)
    if not args.dask:
        readers_early(args, index.suffixes())
    with timeline.span("plan"):  # the GPU probe's answer awaited
        tuning = CallTuning.from_args(args, probed)
    cuda = CudaOptions(disable=args.disable_cuda, mem_frac=args.cuda_mem_frac, avg_epk=args.cuda_avg_epk,
                       max_lf=args.cuda_max_lf, max_epk=args.cuda_max_epk, ultra_thresh=args.ultra_thresh,
                       max_reads=args.batchsize, hmm=not args.disable_cuda_hmm, events=args.cuda_events,
                       autotune=args.autotune, reserve=args.gpu_reserve, memory_cap=args.gpu_memory,
                       stream_priority=args.gpu_stream_priority,
                       lanes=args.compute_threads).with_devices(args.cuda_dev_id)  # fmt: skip
    filt = alignment_filter(args)
    progress = sys.stderr.isatty()
    with ExitStack() as stack:
        sinks = _open_sinks(args, filt)  # before the memory plan: whether the batches keep their events
        for sink in sinks:
            stack.callback(sink.close)
        # the signal readers and the process that parses -b (`ParseProcess`)
        memory = memory_plan(budget_bytes(args.memory_budget, tuning.plan.profile, args.threads), args.max_bases,
                             args.compute_threads, args.io_workers + 1, args.io_mode, tuning.plan.device_share(cuda),
                             discrete_gpu=tuning.plan.discrete_gpu(cuda), events=_events_kept(sinks))  # fmt: skip
        if memory.max_bases < args.max_bases:
            log.debug("batches of at most %d bases (-B %d) to keep within the memory budget of %d MB",
                      memory.max_bases, args.max_bases, memory.budget >> 20)
            args.max_bases = memory.max_bases
        tuning.budgeted(memory)  # the tuner grows B no further than the budget holds
        limits = tuning.limits(BatchLimits(max_reads=args.batchsize, max_bases=args.max_bases))
        cuda = replace(cuda, max_reads=limits.max_reads, max_bases=limits.max_bases,
                       memory_cap=tuning.plan.gpu.memory, lanes=memory.compute_threads)  # fmt: skip
        summary = RunSummary(compiled=compiling, memory_budget=memory.budget)
        stack.enter_context(summary.watching_memory())
        options = pipeline_options(args, index, cuda, methylation=True)
        aligner = open_read_aligner(args, filt)
        output = _Output.open(args, row_sinks(sinks)[0].header, [options.kmer_model, options.meth_model])
        stack.callback(output.close)
        summary.batches_resumed = output.resumed

        def written(batch_calls: int, batch_reads: int) -> None:
            output.batch_written(batch_calls, batch_reads)
            if progress:
                print(f"\r{summary.progress_line()}", end="", file=sys.stderr, flush=True)

        # -b's records parsed off the stages' GIL; its process starts the readers' fork server, with their libraries
        parser = ParseProcess(memory.io_mode != "threads", libraries=reader_libraries(index.suffixes()))
        stack.callback(parser.close)
        run = _CallRun(args, stack, options, index, limits, filt, summary, output, written, aligner, parser)
        if args.dask:
            _on_cluster(run)
        else:
            _here(run, tuning, sinks, memory)
        output.finish()
        closing = time.perf_counter()
    timeline.record("closing", closing, time.perf_counter())  # the readers, the GPU and the sinks let go
    with timeline.span("report"):  # so that what follows the trace's last span is the process's exit alone
        if progress:
            print(file=sys.stderr)
        print(summary.report(), file=sys.stderr)
        if args.stats_json:
            engine = aligner.choice.as_dict() if aligner is not None and aligner.choice is not None else None
            args.stats_json.write_text(json.dumps({**summary.as_dict(), "tuning": tuning.summary(),
                                                   "alignment_engine": engine}, indent=2) + "\n")
    if args.trace:
        timeline.write(args.trace)
    return 0


def _check_combinations(args: argparse.Namespace) -> None:
    if args.dask and (args.autotune or args.bedmethyl or args.modbam or args.skip_ultra or args.sink):
        raise UsageError("--dask writes the call TSV: leave out --autotune, --bedmethyl, --modbam, --sink and "
                         "--skip-ultra")
    if args.modbam and args.methylation != CPG.name:
        raise UsageError(f"--modbam carries CpG calls (C+m) only: leave it out with --methylation {args.methylation}")
    if args.bam is None and (args.modbam or args.skip_ultra):
        raise UsageError("--modbam and --skip-ultra copy records of the -b BAM: give -b (streamer align writes one)")
    if args.resume and (args.output is None or args.autotune):
        raise UsageError("--resume needs -o FILE and fixed batch sizes (no --autotune): the plan must be the same")


class _Output:
    """The call TSV, journaled batch by batch where a run can be resumed (-o FILE): the journal is
    removed once the run completes, so only a killed run leaves one."""

    def __init__(self, out: TextIO, journal: CallJournal | None, resumed: Resumed):
        self.out, self.journal = out, journal
        self.resumed = resumed.batches
        self.batch, self.calls, self.reads = resumed.batches, resumed.calls, resumed.reads

    @classmethod
    def open(cls, args: argparse.Namespace, header: str, models: list[Path | None]) -> _Output:
        if args.output is None:
            return cls(sys.stdout, None, Resumed(0, 0, 0))
        inputs = [args.reads, args.bam, args.genome, *models]
        identity = run_identity([path for path in inputs if path is not None],
                                {k: v for k, v in vars(args).items() if k in OUTPUT_OPTIONS})  # fmt: skip
        journal = CallJournal(args.output, identity)
        resumed = journal.resume(args.output) if args.resume else Resumed(0, 0, 0)
        if args.resume and args.output.exists():
            out = open(args.output, "a")
            if out.tell() == 0:
                out.write(header)
        else:
            out = open(args.output, "w")
            out.write(header)
            journal.start()
        out.flush()
        return cls(out, journal, resumed)

    def write(self, text: str) -> None:
        self.out.write(text)

    def batch_written(self, calls: int, reads: int) -> None:
        self.out.flush()
        self.calls += calls
        self.reads += reads
        if self.journal is not None:
            self.journal.batch_written(self.batch, self.out.tell(), self.calls, self.reads)
        self.batch += 1

    def finish(self) -> None:
        """The run completed: nothing left to resume."""
        if self.journal is not None:
            self.journal.close()
            self.journal.path.unlink(missing_ok=True)
            self.journal = None

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
        if self.out is not sys.stdout:
            self.out.close()


# the options whose change changes the output: a journal is resumed only under the same ones
OUTPUT_OPTIONS = ("reads", "bam", "align_engine", "genome", "signal", "batchsize", "max_bases", "min_mapq",
                  "secondary", "kmer_model", "model_dir", "pore", "meth_model", "methylation", "disable_cuda",
                  "ultra_thresh")  # fmt: skip


def _open_sinks(args: argparse.Namespace, filt: AlignmentFilter) -> list[Sink]:
    """The sinks of the flags, opened as the daemon opens its own: `--sink` is the key `output.sinks`,
    each output file a name in the context."""
    files = {"bedmethyl": args.bedmethyl, "modbam": args.modbam, "bam": args.bam, "filter": filt,
             "command_line": " ".join(["streamer", *sys.argv[1:]])}  # fmt: skip
    out_dir = args.output.parent if args.output is not None else Path.cwd()
    config = Config(pipeline=replace(PipelineConfig(), methylation=args.methylation),
                    output=OutputConfig(sinks=tuple(args.sink)))
    return open_sinks(config, SinkContext(NAME, out_dir=out_dir, files=files))


@dataclass(frozen=True)
class _CallRun:
    """What either host of a run needs: the command line, what closes at its end, the pipeline's
    options, the signal index, batch caps, the alignment filter, the counts, the call TSV, and without
    -b the aligner of the basecalls."""

    args: argparse.Namespace
    stack: ExitStack
    options: PipelineOptions
    index: SignalIndex
    limits: BatchLimits
    filt: AlignmentFilter
    summary: RunSummary
    output: _Output
    written: Callable[[int, int], None]
    aligner: ReadAligner | SeedAligner | None
    parser: ParseProcess

    def alignments(self, basecalls: Callable[[], Mapping[str, str]]) -> Iterator[AlignmentRecord | Skipped]:
        """The records to plan from (`commands._inputs.alignments`): -b's parsed from now on."""
        return alignments(self.args, self.filt, basecalls, self.aligner, self.limits.max_reads, self.parser)


def _here(run: _CallRun, tuning: CallTuning, sinks: list[Sink], memory: MemoryPlan) -> None:
    """This host: reader pool, the pipeline (GPU if any), overlapped batches as many as the memory budget holds.

    Where a GPU is planned for and the readers are processes, the pipeline starts (its GPUs, the warm-up:
    a second or more of Python) once the first batches' reads have begun, so that they are read, packed
    and their events detected meanwhile. On the CPU alone it starts first (a few tenths of a second, which
    the overlap did not gain back on 2 cores), and so it does with reader threads (a small budget's), which
    would take the GIL from it. As f5c does, ultra-long reads wait for the end of the run where the GPU aligns
    the rest: where one is planned for, as the batches are planned before the GPU's start-up is done.
    """
    rows = row_sinks(sinks)[0]  # the calls TSV
    runner = runner_options(memory, run.args.io_workers)
    records = run.alignments(lambda: host.basecalls)  # the first batches planned from while the pipeline starts
    with timeline.span("open"):
        host = open_host(run.stack, run.args, run.index, run.options, runner, registry.analysis("cpg"), start=False)
    pipeline, ref, pool, basecalls = host.pipeline, host.ref, host.pool, host.basecalls
    gpu_planned = not run.options.cuda.disable and tuning.plan.machine.gpu is not None
    ultra = UltraLong(run.args.ultra_thresh, run.args.skip_ultra) if gpu_planned else None
    plans = plan_batches(records, basecalls, run.index, run.limits, str(run.args.reads), ultra, ramp=RAMP)

    def start() -> None:
        with timeline.span("start-up"):
            pipeline.start()
            rows.render(pipeline.warm_up_result)  # the TSV kernel, compiled now too
            tuning.attach(pipeline.gpu)
        run.summary.startup_s = run.summary.elapsed

    early = gpu_planned and reader_mode(memory.io_mode) == "processes"
    if not early:
        start()

    def on_done(done: Done) -> None:
        log_skipped(log, done.outcome.skipped)
        for result, text in zip(done.results, done.rendered):
            run.output.write(text)
            tuning.observe(result.gpu_stats)
            for sink in sinks:
                sink.on_batch(result)
        run.written(done.outcome.calls, done.outcome.records_called)

    run_batches(pipeline, islice(plans, run.output.resumed, None), ref, pool, run.summary, on_done,
                Stages(pipeline, rows.render, rows.count, keep_signal=False, keep_events=_events_kept(sinks)), runner,
                start if early else lambda: None)  # fmt: skip
    for device, n in zip(pipeline.devices, pipeline.pool.batches):  # a GPU's lanes summed (the warm-up takes none)
        key = f"batches_on_gpu{device.dev_id}"
        run.summary.gpu[key] = run.summary.gpu.get(key, 0) + n
    tuning.finish()
    if ultra is not None and ultra.skip_to is not None:
        write_records(run.args.bam, ultra.skip_to, ultra.skipped_ids, run.filt)
    for sink in sinks:
        sink.refresh(final=True)


def _events_kept(sinks: list[Sink]) -> bool:
    """Whether a batch keeps its events' starts, lengths and spreads past the scalings: a sink renders them."""
    return any(sink.needs_events for sink in sinks)


def _on_cluster(run: _CallRun) -> None:
    """A Dask cluster: batches planned here, read and computed on the workers (`streamer.cluster`)."""
    from streamer import cluster

    options = run.options

    client, workers, close = cluster.connect(run.args.dask, run.args.threads)
    run.stack.callback(close)
    if run.args.dask.startswith("local"):  # this host's threads shared by its workers
        options = replace(options, threads=max(1, run.args.threads // workers))
    models = [m for m in (options.kmer_model, options.meth_model) if m is not None]
    cluster.check_paths(client, [run.args.reads, run.args.genome, *models, *sorted(set(run.index.paths.values()))])
    basecalls = run.stack.enter_context(open_basecalls(run.args.reads))
    run.summary.startup_s = run.summary.elapsed
    plans = plan_batches(run.alignments(lambda: basecalls), basecalls, run.index, run.limits, str(run.args.reads))
    numbered = ((seq, pending, skipped) for seq, (pending, skipped) in enumerate(plans) if seq >= run.output.resumed)

    def on_done(done: Done) -> None:
        log_skipped(log, done.outcome.skipped)
        run.summary.add(done.outcome)
        run.output.write("".join(done.rendered))
        run.written(done.outcome.calls, done.outcome.records_called)

    job = cluster.ClusterJob(options, str(run.args.genome), Config(), SinkContext(NAME))
    cluster.run_on_cluster(client, workers, job, numbered, on_done)
