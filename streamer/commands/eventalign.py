"""`streamer eventalign`: events aligned to reference k-mers (like `f5c eventalign` / `nanopolish eventalign`)."""

from __future__ import annotations

import argparse
import logging
import sys
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from streamer.pipeline.batching import RAMP, BatchLimits, plan_batches
from streamer.pipeline.chemistry import CHEMISTRIES, as_rna, title
from streamer.commands._inputs import (add_input_arguments, add_memory_argument, alignment_filter, check_inputs,
                                       open_host, pipeline_options, runner_options, signal_index)
from streamer import registry
from streamer.commands._checks import removed_on_failure
from streamer.pipeline.gpu import CudaOptions, device_spec
from streamer.io.alignments import iter_alignments
from streamer.pipeline.planned import run_batches
from streamer.pipeline.runner import RunnerOptions
from streamer.pipeline.steps import Done, Stages
from streamer.config import Config, EventalignConfig
from streamer.sinks import SinkContext, open_sinks, row_sinks
from streamer.skips import log_skipped
from streamer.summary import RunSummary
from streamer.tuning.profiles import budget_bytes, memory_plan
from streamer.tuning.session import first_gpu, prepare, probe_ahead

NAME = "eventalign"
HELP = "align events to reference k-mers and write the eventalign TSV"

log = logging.getLogger(__name__)


def _rna_pores() -> str:
    """The direct RNA chemistries `--rna` reads, from the registry: `RNA002, or RNA004 where ...`."""
    default = as_rna(None)
    others = " or ".join(c.title for c in CHEMISTRIES.values() if c.reverse_signal and c.name != default)
    return f"{title(default)}, or {others} where --pore or the run metadata says so" if others else title(default)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_arguments(p, "eventalign TSV")
    p.add_argument("--print-read-names", action="store_true", help="read names instead of read indices")
    p.add_argument("--scale-events", action="store_true", help="scale events to the model, not the model to the events")
    p.add_argument("--signal-index", action="store_true", help="each event's first and past-last sample index")
    p.add_argument("--samples", action="store_true", help="each event's samples, scaled to the model")
    p.add_argument("--rna", action="store_true",
                   help=f"direct RNA reads (f5c's --rna): {_rna_pores()}; their signal runs 3'->5' and U is read as T")
    p.add_argument("--compat", choices=("f5c", "nanopolish"), default="f5c",
                   help="whose arithmetic to follow where tied paths differ in the last bit: f5c 1.1 or nanopolish "
                        "0.14 (its built-in model to 5 decimals, scalings in double) [%(default)s]")
    p.add_argument("--summary", type=Path, metavar="FILE", help="also write a summary line per read to FILE")
    p.add_argument("--sam", action="store_true",
                   help="write SAM instead of TSV: each read's events aligned to the reference (nanopolish's format)")
    p.add_argument("--sam-out-version", choices=("1", "2"), default="1",
                   help="--sam's version: 1 event-space records (nanopolish's, f5c 1.1's), 2 each input record with "
                        "its signal alignment in f5c 1.6's si/ss/sc/sh tags (f5c 1.6's default) [%(default)s]")
    p.add_argument("--disable-cuda", action="store_true", help="align on the CPU only")
    add_memory_argument(p)
    p.add_argument("--cuda-dev-id", type=device_spec, default=str(CudaOptions.dev_id),
                   help="GPU to use, a list of them (0,1) or all: batches go to the least loaded [%(default)s]")


def run(args: argparse.Namespace) -> int:
    probed = None if args.disable_cuda else probe_ahead(first_gpu(args))  # while the inputs are checked and indexed
    check_inputs(args, "output", "summary")
    compiling = getattr(args, "compiling_kernels", False)  # announced by streamer.cli before the imports
    with removed_on_failure(args.output, args.summary):
        return _run(args, compiling, probed)


def _run(args: argparse.Namespace, compiling: bool, probed: Future | None) -> int:
    index = signal_index(args)
    plan = prepare({}, dev_id=first_gpu(args), disable_cuda=args.disable_cuda, probed=probed)
    cuda = CudaOptions(disable=args.disable_cuda, max_reads=args.batchsize, hmm=False, reserve=plan.gpu.reserve,
                       stream_priority=plan.gpu.stream_priority,
                       lanes=RunnerOptions.compute_threads).with_devices(args.cuda_dev_id)
    memory = memory_plan(budget_bytes(args.memory_budget, plan.profile, args.threads), args.max_bases,
                         RunnerOptions.compute_threads, RunnerOptions.io_workers, device=plan.device_share(cuda),
                         discrete_gpu=plan.discrete_gpu(cuda))  # its sinks render the events: kept
    limits = BatchLimits(max_reads=args.batchsize, max_bases=memory.max_bases)
    cuda = replace(cuda, max_bases=limits.max_bases, memory_cap=plan.budgeted(memory).gpu.memory,
                   lanes=memory.compute_threads)
    runner = runner_options(memory)
    filt = alignment_filter(args)
    summary = RunSummary(compiled=compiling, memory_budget=memory.budget)
    with ExitStack() as stack:
        stack.enter_context(summary.watching_memory())
        options = pipeline_options(args, index, cuda, methylation=False)
        host = open_host(stack, args, index, options, runner,
                         registry.analysis("eventalign", args.scale_events, args.compat))
        pipeline = host.pipeline
        summary.startup_s = summary.elapsed
        # the TSV's read_index is the record's place in the BAM, every record counted, as the tools number it
        sinks = open_sinks(_config(args), SinkContext(NAME, files={
            "eventalign-sam": (args.output or "-") if args.sam else None, "template_bam": args.bam,
            "eventalign-summary": args.summary}, options={"sam_out_version": int(args.sam_out_version),
                                                            "compat": args.compat}))  # fmt: skip
        for sink in sinks:
            stack.callback(sink.close)
        rows = row_sinks(sinks)[0]  # the TSV
        out = None
        if not args.sam:
            out = stack.enter_context(open(args.output, "w")) if args.output else sys.stdout
            out.write(rows.header)

        def on_done(done: Done) -> None:
            for result, text in zip(done.results, done.rendered):
                if out is not None:
                    out.write(text)
                for sink in sinks:
                    sink.on_batch(result)
            log_skipped(log, done.outcome.skipped)

        plans = plan_batches(iter_alignments(args.bam, filt), host.basecalls, index, limits, str(args.reads), ramp=RAMP)
        render = rows.render if out is not None else (lambda result: None)
        stages = Stages(pipeline, render, rows.count, keep_signal=any(s.needs_signal for s in sinks))
        run_batches(pipeline, plans, host.ref, host.pool, summary, on_done, stages, runner)
    print(summary.report(), file=sys.stderr)
    return 0


def _config(args: argparse.Namespace) -> Config:
    """The flags as the daemon's `eventalign.*` keys, so the sinks open here as they do there."""
    return Config(eventalign=EventalignConfig(enabled=True, print_read_names=args.print_read_names,
                                              scale_events=args.scale_events, signal_index=args.signal_index,
                                              samples=args.samples))  # fmt: skip
