"""`streamer align`: basecalls aligned to a reference into a sorted, indexed BAM (like
`minimap2 -ax map-ont REF READS | samtools sort` and `samtools index`), with mappy or streamer's own
engine; `streamer call -b` and samtools read it."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pysam

from streamer.align import ENGINES
from streamer.config import AlignmentConfig
from streamer.commands._checks import check_files, check_writable, numeric, removed_on_failure
from streamer.daemon.aligner import open_aligner
from streamer.errors import InputError
from streamer.io.alignments import AlignmentFilter
from streamer.io.fastx import iter_fastx

NAME = "align"
HELP = "align basecalls (FASTA/FASTQ) to a reference into a sorted, indexed BAM"

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-r", "--reads", type=Path, required=True, help="basecalls, FASTA or FASTQ (plain or gzip)")
    p.add_argument("-g", "--genome", type=Path, required=True, help="reference FASTA (plain, bgzip or gzip)")
    p.add_argument("-o", "--output", type=Path, required=True, help="the sorted BAM to write (and its .bai)")
    p.add_argument("--engine", choices=ENGINES, default=AlignmentConfig.engine,
                   help="mappy (minimap2 map-ont), or streamer's FM-index seeds, chains and extension with its "
                        "seeding on the gpu or the cpu; auto: gpu where a GPU is there and it agrees with mappy "
                        "(checked once per reference), else mappy [%(default)s]")
    p.add_argument("--preset", default="map-ont", help="minimap2 preset of the mappy engine [%(default)s]")
    numeric(p, "-t", "--threads", type=int, minimum=1, default=2, help="CPU threads [%(default)s]")
    numeric(p, "-K", "--batchsize", type=int, minimum=1, default=4000, help="reads aligned at a time [%(default)s]")


def run(args: argparse.Namespace) -> int:
    check_files(**{"-r/--reads": args.reads, "-g/--genome": args.genome})
    check_writable(**{"-o/--output": args.output})
    index = Path(f"{args.output}.bai")
    with removed_on_failure(args.output, index):
        return _run(args, index)


def _batches(path: Path, size: int) -> Iterator[list[tuple[str, str]]]:
    reads = iter_fastx(path)
    while batch := list(islice(reads, size)):
        yield batch


def _unmapped(header: pysam.AlignmentHeader, read_id: str, seq: str) -> pysam.AlignedSegment:
    rec = pysam.AlignedSegment(header)
    rec.query_name, rec.flag, rec.query_sequence = read_id, 4, seq
    rec.reference_id = rec.next_reference_id = -1
    return rec


def _run(args: argparse.Namespace, index: Path) -> int:
    started = time.monotonic()
    aligner = open_aligner(args.engine, args.genome, AlignmentFilter(min_mapq=0, secondary=True),
                           preset=args.preset, threads=args.threads)
    built = time.monotonic() - started
    header = aligner.header.to_dict() | {"PG": [{"ID": "streamer-align", "PN": "streamer",
                                                 "CL": " ".join(["streamer", *sys.argv[1:]])}]}
    unsorted = args.output.with_name(args.output.name + ".unsorted.tmp")
    n_reads = n_mapped = n_bases = 0
    try:
        with pysam.AlignmentFile(str(unsorted), "wb", header=header) as out:
            for batch in _batches(args.reads, args.batchsize):
                for (rid, seq), recs in zip(batch, aligner.records_all(batch)):
                    for rec in recs or [_unmapped(aligner.header, rid, seq)]:
                        out.write(rec)
                    n_mapped += bool(recs)
                n_reads += len(batch)
                n_bases += sum(len(seq) for _, seq in batch)
        aligned = time.monotonic() - started - built
        pysam.sort("-o", str(args.output), "-@", str(args.threads), str(unsorted))
        pysam.index(str(args.output))
    except pysam.utils.SamtoolsError as exc:
        raise InputError(args.output, f"cannot sort or index the BAM: {exc}") from None
    finally:
        unsorted.unlink(missing_ok=True)
    log.info("%s engine: index ready in %.1f s; %d reads (%d mapped, %.2f Mbases) aligned in %.1f s (%.2f Mbases/s) "
             "-> %s", aligner.choice.engine, built, n_reads, n_mapped, n_bases / 1e6, aligned,
             n_bases / 1e6 / max(aligned, 1e-9), args.output)
    return 0
