"""`streamer eventalign`: events aligned to reference k-mers (like `f5c eventalign` / `nanopolish eventalign`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import ExitStack
from pathlib import Path

import pysam

from streamer.assemble import BatchLimits, load_signals, make_read_input, plan_batches, signal_requests
from streamer.batch import pack
from streamer.commands._inputs import (
    add_input_arguments,
    alignment_filter,
    model_files,
    signal_index,
)
from streamer.gpu_api import CudaOptions
from streamer.io.alignments import Alignment, iter_alignments
from streamer.io.bamreads import open_basecalls
from streamer.io.reference import Reference
from streamer.pipeline import PipelineOptions
from streamer_plugins.eventalign import (
    COMPAT,
    SUMMARY_HEADER,
    EventalignOptions,
    EventalignPipeline,
    format_tsv,
    sam_records,
    summary_lines,
    tsv_header,
)
from streamer.skips import Skip, Skipped
from streamer.summary import RunSummary

NAME = "eventalign"
HELP = "align events to reference k-mers and write the eventalign TSV"

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_arguments(p, "eventalign TSV")
    p.add_argument("--print-read-names", action="store_true", help="read names instead of read indices")
    p.add_argument("--scale-events", action="store_true", help="scale events to the model, not the model to the events")
    p.add_argument("--signal-index", action="store_true", help="each event's first and past-last sample index")
    p.add_argument("--samples", action="store_true", help="each event's samples, scaled to the model")
    p.add_argument("--compat", choices=COMPAT, default="f5c",
                   help="whose arithmetic to follow where tied paths differ in the last bit: f5c 1.1 or nanopolish "
                        "0.14 (its built-in model to 5 decimals, scalings in double) [%(default)s]")
    p.add_argument("--summary", type=Path, metavar="FILE", help="also write a summary line per read to FILE")
    p.add_argument("--sam", action="store_true",
                   help="write SAM instead of TSV: each read's events aligned to the reference (nanopolish's format)")
    p.add_argument("--disable-cuda", action="store_true", help="align on the CPU only")
    p.add_argument("--cuda-dev-id", type=int, default=CudaOptions.dev_id, help="GPU to use [%(default)s]")


def _display_path(path: str) -> str:
    """The signal file relative to the working directory when it lies below it (as f5c's index names it)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def run(args: argparse.Namespace) -> int:
    opts = EventalignOptions(args.print_read_names, args.scale_events, args.signal_index, args.samples)
    limits = BatchLimits(max_reads=args.batchsize, max_bases=args.max_bases)
    cuda = CudaOptions(disable=args.disable_cuda, dev_id=args.cuda_dev_id, max_reads=limits.max_reads,
                       max_bases=limits.max_bases, hmm=False)  # fmt: skip
    filt = alignment_filter(args)
    summary = RunSummary()
    with ExitStack() as stack:
        index = signal_index(args)
        kmer_model, _ = model_files(args, index, methylation=False)
        basecalls = stack.enter_context(open_basecalls(args.reads))
        pipeline = EventalignPipeline(PipelineOptions(threads=args.threads, kmer_model=kmer_model, cuda=cuda),
                                      scale_events=args.scale_events, compat=args.compat)  # fmt: skip
        summary.startup_s = summary.elapsed
        ref = stack.enter_context(Reference(args.genome))
        if args.sam:
            with pysam.AlignmentFile(str(args.bam), "rb", check_sq=False) as bam:
                sam = stack.enter_context(pysam.AlignmentFile(str(args.output or "-"), "w", template=bam))
        else:
            out = stack.enter_context(open(args.output, "w")) if args.output else sys.stdout
            out.write(tsv_header(opts))
        summ = stack.enter_context(open(args.summary, "w")) if args.summary else None
        if summ is not None:
            summ.write(SUMMARY_HEADER)
        # read_index is the record's place in the BAM, every record counted, as the tools number it
        record_index: dict[int, int] = {}

        def numbered():
            for i, rec in enumerate(iter_alignments(args.bam, filt)):
                if isinstance(rec, Alignment):
                    record_index[id(rec)] = i
                yield rec

        for pending, skipped in plan_batches(numbered(), basecalls, index, limits, str(args.reads)):
            summary.reads_in += len(pending) + len(skipped)
            signals, errors = load_signals(signal_requests(pending))
            reads, numbers, mapq = [], [], []
            for aln, seq, path in pending:
                sig = signals.get(aln.read_id)
                if sig is None:
                    skipped.append(Skipped(aln.read_id, Skip.BAD_SIGNAL_FILE, errors[aln.read_id]))
                else:
                    reads.append(make_read_input(aln, seq, sig, ref, str(path)))
                    numbers.append(record_index.pop(id(aln)))
                    mapq.append(aln.mapq)
            if reads:
                result = pipeline.run_batch(pack(reads))
                batch = result.batch
                labels = batch.read_ids if opts.print_read_names else [str(n) for n in numbers]
                if args.sam:
                    for rec in sam_records(result.rows, batch, mapq, sam.header):
                        sam.write(rec)
                else:
                    out.write(format_tsv(result.rows, batch, labels, opts))
                if summ is not None:
                    summ.write(summary_lines(result.rows, batch, numbers, [_display_path(p) for p in batch.signal_paths]))
                skipped += result.skipped
                summary.reads_called += batch.n - len(result.skipped)
                summary.bases += batch.n_bases
                summary.calls += len(result.rows)
                summary.stage_seconds.update(result.timings)
            for s in skipped:
                log.info("%s", s.message())
                summary.skip(s.reason)
    print(summary.report(), file=sys.stderr)
    return 0
