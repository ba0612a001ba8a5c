"""What `streamer call` and `streamer eventalign` both read and start: basecalls, alignments, reference,
signal, and this host's readers and pipeline.

A private module (its name starts with `_`), so the command discovery in `streamer.cli` passes it over.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamer.pipeline.batching import BatchLimits
from streamer.commands._checks import check_bam, check_files, check_writable, numeric
from streamer.errors import ModelError, StreamerError
from streamer.align import ENGINES
from streamer.config import AlignmentConfig
from streamer.io.alignments import AlignmentFilter, AlignmentRecord
from streamer.io.bamreads import open_basecalls
from streamer.io.index import SignalIndex, open_index
from streamer.io.reference import Reference
from streamer.pipeline.gpu import CudaOptions
from streamer.pipeline.runner import RunnerOptions
from streamer.pipeline.parsing import ParseProcess
from streamer.pipeline import cuda_start
from streamer.pipeline.signal_pool import reader_mode, reader_pool, start_fork_server
from streamer.pipeline.stages import Pipeline, PipelineOptions
from streamer.skips import Skipped
from streamer.pore.motifs import motif
from streamer.tuning.profiles import SMALL_BUDGET, MemoryPlan, parse_size
from streamer.pipeline.chemistry import (DEFAULT, PORES, as_rna, chemistry, default_models, folder_models, pore_models,
                                         pore_from_metadata, title)

log = logging.getLogger(__name__)


def add_input_arguments(p: argparse.ArgumentParser, output: str, *, align: bool = False) -> None:
    """The input files, batching and filtering flags; `output` describes what -o receives. With `align`,
    -b may be left out: the basecalls are then aligned with `--align-engine`."""
    p.add_argument("-r", "--reads", required=True, type=Path,
                   help="basecalls: FASTA/FASTQ (plain or gzip) or dorado/MinKNOW BAM (unaligned or aligned)")
    if align:
        p.add_argument("-b", "--bam", type=Path,
                       help="reads aligned to the reference (BAM) [none: the basecalls are aligned with "
                            "--align-engine]")
        p.add_argument("--align-engine", choices=ENGINES, default=AlignmentConfig.engine,
                       help="without -b, the aligner of the basecalls: mappy (minimap2 map-ont), streamer's own "
                            "FM-index engine seeding on the gpu or the cpu, or auto: gpu where a GPU is there and "
                            "it agrees with mappy (checked once per reference), else mappy [%(default)s]")
    else:
        p.add_argument("-b", "--bam", required=True, type=Path, help="reads aligned to the reference (BAM)")
    p.add_argument("-g", "--genome", required=True, type=Path, help="reference FASTA")
    p.add_argument("--signal", nargs="+", metavar="DIR_OR_FILE",
                   help="signal files or folders (default: the index cached beside --reads)")
    p.add_argument("-o", "--output", type=Path, help=f"{output} (default: stdout)")
    numeric(p, "-t", "--threads", key="pipeline.threads", default=PipelineOptions.threads,
            help="CPU threads; 0: every core [%(default)s]")
    numeric(p, "-K", "--batchsize", key="batch.max_reads", default=BatchLimits.max_reads,
            help="most reads per batch [%(default)s]")
    numeric(p, "-B", "--max-bases", key="batch.max_bases", default=BatchLimits.max_bases,
            help="most bases per batch [%(default)s]")
    numeric(p, "--min-mapq", key="alignment.min_mapq", default=AlignmentFilter.min_mapq,
            help="minimum mapping quality [%(default)s]")
    p.add_argument("--secondary", choices=("yes", "no"), default="no", help="use secondary alignments [%(default)s]")
    p.add_argument("--kmer-model", type=Path,
                   help=f"nucleotide pore model file, text or uncalled4 .npz (default: {default_models()})")
    p.add_argument("--model-dir", type=Path,
                   help=f"folder of per-pore models: {folder_models()} from it unless --kmer-model/--meth-model "
                        "name others (default: $STREAMER_MODEL_DIR, else $XDG_DATA_HOME/streamer/models)")
    p.add_argument("--pore", choices=("auto", *PORES), default="auto",
                   help=f"pore chemistry; auto: from the signal files' run metadata, {DEFAULT.name} when they do "
                        "not say [%(default)s]")


def size_arg(text: str) -> str:
    """An argparse type for a size (`300M`, `2G`) or `auto`: checked here, kept as text."""
    try:
        if text != "auto":
            parse_size(text)
        return text
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_memory_argument(p: argparse.ArgumentParser) -> None:
    """`--memory-budget`, the key `pipeline.memory_budget`: a size, or auto (the device profile's)."""
    p.add_argument("--memory-budget", type=size_arg, default="auto", metavar="SIZE",
                   help="memory the run may take, summed over its processes (300M, 2G): batch size, batches in "
                        "flight and reader kind follow from it; on a Jetson it holds the GPU's part too "
                        "[auto: the device profile's]")


def check_inputs(args: argparse.Namespace, *outputs: str) -> None:
    """The input files exist and are what they should be, and the outputs (`args` attributes named by
    `outputs`) can be written: checked before any work, so a mistake costs one line and no file.
    `-t 0` becomes every core, as `pipeline.threads: 0` does for the daemon."""
    args.threads = args.threads or os.cpu_count() or 1
    check_files(**{"-g/--genome": args.genome, "--kmer-model": args.kmer_model,
                   "--meth-model": getattr(args, "meth_model", None)})
    if args.bam is not None:
        check_bam(args.bam)
    check_writable(**{f"--{name.replace('_', '-')}": getattr(args, name) for name in outputs})


if TYPE_CHECKING:  # the aligners are imported when a run without -b needs one: `call` starts sooner
    from streamer.align.engine import SeedAligner
    from streamer.daemon.aligner import ReadAligner


def alignment_filter(args: argparse.Namespace) -> AlignmentFilter:
    return AlignmentFilter(min_mapq=args.min_mapq, secondary=args.secondary == "yes")


def open_read_aligner(args: argparse.Namespace, filt: AlignmentFilter) -> ReadAligner | SeedAligner | None:
    """Without -b, the aligner of `--align-engine` for the basecalls (its choice said in the log); None with -b."""
    if args.bam is not None:
        return None
    from streamer.daemon.aligner import open_aligner

    return open_aligner(args.align_engine, args.genome, filt, threads=args.threads)


def alignments(args: argparse.Namespace, filt: AlignmentFilter, basecalls: Callable[[], Mapping[str, str]],
               aligner: ReadAligner | SeedAligner | None, chunk: int, parser: ParseProcess
               ) -> Iterator[AlignmentRecord | Skipped]:  # fmt: skip
    """The records a run plans its batches from: -b's in file order (parsed by `parser` from now on), or
    the basecalls' own records in their order (`basecalls()`, asked for at the first record), aligned
    `chunk` reads at a time as the planning takes them (so a run holds one chunk's)."""
    if aligner is None:
        return parser.records(args.bam, filt)
    from streamer.daemon.aligner import aligned_records

    def each() -> Iterator[tuple[str, str]]:
        reads = basecalls()
        yield from ((rid, reads[rid]) for rid in reads)

    return aligned_records(aligner, each(), chunk)


def signal_index(args: argparse.Namespace) -> SignalIndex:
    """The read id -> signal file index; unreadable signal files are reported here, once."""
    index = open_index(args.reads, args.signal)
    for path, reason in index.bad_files.items():
        log.warning("%s: unreadable signal file, its reads are reported as missing signal: %s", path, reason)
    return index


def pore_of_inputs(args: argparse.Namespace, index: SignalIndex) -> tuple[str | None, str]:
    """The pore `--pore` names or, with `auto`, the first signal file's run metadata names (None if it
    does not say); and where that came from, for messages."""
    if args.pore != "auto":
        return args.pore, f"--pore {args.pore}"
    first = index.first_run_metadata()
    if first is None:
        return None, ""
    path, metadata = first
    return pore_from_metadata(list(metadata.values())), f"{path}'s run metadata"


def pipeline_options(args: argparse.Namespace, index: SignalIndex, cuda: CudaOptions, *,
                     methylation: bool) -> PipelineOptions:  # fmt: skip
    """The pipeline for the inputs' pore: its chemistry, the motif of `--methylation` (CpG without it), and
    its nucleotide and methylation model files (those the flags name, else the chemistry's; one not shipped
    and missing stops the command with one line naming it)."""
    pore, source = pore_of_inputs(args, index)
    if getattr(args, "rna", False):  # eventalign's --rna
        pore, source = as_rna(pore), f"--rna ({source})" if source else "--rna"
    called = motif(getattr(args, "methylation", None))
    try:
        kmer, meth = pore_models(pore, args.kmer_model, getattr(args, "meth_model", None), args.model_dir,
                                 methylation=methylation, motif=called)  # fmt: skip
    except ModelError as exc:
        raise StreamerError(f"{title(pore)} reads ({source}): {exc}") from None
    return PipelineOptions(threads=args.threads, kmer_model=kmer, meth_model=meth, cuda=cuda, chemistry=chemistry(pore),
                           motif=called)  # fmt: skip


def runner_options(memory: MemoryPlan, io_workers: int = RunnerOptions.io_workers) -> RunnerOptions:
    """The batch driver's settings the memory budget decided (`streamer.tuning.profiles.memory_plan`)."""
    return RunnerOptions(io_workers=max(1, io_workers), io_mode=memory.io_mode, compute_threads=memory.compute_threads,
                         ahead=memory.ahead, tight_heap=memory.tight_heap)


@dataclass(frozen=True)
class Host:
    """What a run on this host works with: the signal readers, the basecalls, the pipeline, the reference."""

    pool: Executor
    basecalls: Any
    pipeline: Pipeline
    ref: Reference


def readers_early(args: argparse.Namespace, suffixes: list[str]) -> None:
    """Where a GPU's start-up is coming (the driver has found the device), the readers' fork server is
    started now, on a side thread: its imports (the formats' readers and numpy, `streamer.io.signal_chunks`) go
    on beside the plan and the GPU's start-up, so that the readers are up when the first batches go out
    (`streamer call`). Elsewhere,
    and where readers are threads or a budget under SMALL_BUDGET may make them so, it starts with them."""
    if reader_mode(args.io_mode) == "threads" or (
            args.memory_budget not in (None, "auto") and parse_size(args.memory_budget) < SMALL_BUDGET):
        return

    def start() -> None:
        if cuda_start.found(timeout=5.0):
            start_fork_server(suffixes)

    threading.Thread(target=start, name="fork-server-start", daemon=True).start()


def open_host(stack: ExitStack, args: argparse.Namespace, index: SignalIndex, options: PipelineOptions,
              runner: RunnerOptions, analysis: Any, start: bool = True) -> Host:  # fmt: skip
    """Start the readers, index the reads file and load the pipeline (with `analysis` after the core's
    stages) side by side, all closed with `stack`; without `start`, the pipeline's start is the caller's
    (`Pipeline.start`)."""
    pool = reader_pool(index, runner.io_workers, runner.io_mode)  # readers start while the pipeline loads
    stack.callback(pool.shutdown, wait=True, cancel_futures=True)
    with ThreadPoolExecutor(1) as early:  # the reads file is indexed while the pipeline starts
        basecalls = early.submit(open_basecalls, args.reads)
        pipeline = Pipeline(options, [analysis], start=start)
        basecalls = stack.enter_context(basecalls.result())
    return Host(pool, basecalls, pipeline, stack.enter_context(Reference(args.genome)))
