"""`streamer replay`: re-enact a finished run into a live folder, for demos, tests and benchmarks."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from streamer.commands._checks import numeric
from streamer.daemon.replay import COMPRESSION, SIGNAL_FORMATS, Replayer, ReplayOptions, load_source

NAME = "replay"
HELP = "write a finished run's reads into a folder the way MinKNOW writes a live run"

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ReplayOptions()
    p.add_argument("finished_run", type=Path, help="folder of the finished run (FAST5 + FASTQ/FASTA [+ BAM])")
    p.add_argument("live_dir", type=Path, help="folder to write the run into (a run folder is made inside)")
    numeric(p, "--speed", type=float, minimum=0, default=d.speed,
            help="pace relative to the original run; 0 writes as fast as it can [%(default)s]")
    numeric(p, "--interval", type=float, minimum=0, help="seconds between batches, instead of the original pace")
    numeric(p, "--batch-size", type=int, minimum=1, default=d.batch_reads, dest="batch_reads",
            help="reads per batch file [%(default)s]")
    p.add_argument("--mode", choices=("move", "inplace"), default=d.mode,
                   help="write elsewhere and move in (live basecalling), or write in place [%(default)s]")
    numeric(p, "--write-seconds", type=float, minimum=0, default=d.write_seconds,
            help="with --mode inplace: take this long to write each file [%(default)s]")
    numeric(p, "--basecall-lag", type=float, default=d.basecall_lag,
            help="seconds after its FAST5 that a batch's basecalls land; negative: before [%(default)s]")
    p.add_argument("--no-bam", dest="bam", action="store_false", help="do not write bam_pass/ even if the run has a BAM")
    p.add_argument("--signal-format", choices=SIGNAL_FORMATS, default=d.signal_format,
                   help="signal file format written [%(default)s]")
    p.add_argument("--compression", choices=tuple(COMPRESSION), default=d.compression,
                   help="FAST5 signal compression [%(default)s]")
    p.add_argument("--flowcell", default=d.flowcell, help="flow cell id used in file names [%(default)s]")


def run(args: argparse.Namespace) -> int:
    opts = ReplayOptions(speed=args.speed, interval=args.interval, batch_reads=args.batch_reads, mode=args.mode,
                         write_seconds=args.write_seconds, basecall_lag=args.basecall_lag, bam=args.bam,
                         compression=args.compression, signal_format=args.signal_format, flowcell=args.flowcell)
    src = load_source(args.finished_run)
    replayer = Replayer(src, args.live_dir, opts)
    log.info("replaying %d reads in %d batches into %s", len(src.reads), len(replayer.batches), replayer.run_dir)
    run_dir = replayer.run()
    print(run_dir)
    return 0
