"""`streamer replay`: re-enact a finished run into a live folder, for demos, tests and benchmarks.

Faster than it can write: `--stage-only` writes the batch files once into a staged run folder,
and replaying that folder moves them in at the asked pace (`streamer.daemon.staged`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from streamer.commands._checks import numeric
from streamer.daemon.replay import COMPRESSION, SIGNAL_FORMATS, Replayer, load_source
from streamer.daemon.replay_plan import Pace, ReplayOptions
from streamer.daemon.staged import load_staged, replay_staged, stage
from streamer.errors import UsageError

NAME = "replay"
HELP = "write a finished run's reads into a folder the way MinKNOW writes a live run"

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ReplayOptions()
    p.add_argument("finished_run", type=Path,
                   help="folder of the finished run (signal + FASTQ/FASTA [+ BAM]), or a run folder --stage-only wrote")
    p.add_argument("live_dir", type=Path, help="folder to write the run into (a run folder is made inside)")
    p.add_argument("--stage-only", action="store_true",
                   help="write the batch files once into LIVE_DIR as a staged run, to be replayed fast later")
    p.add_argument("--keep-staged", action="store_true", help="replaying a staged run: leave it in place to use again")
    numeric(p, "--speed", type=float, minimum=0, default=d.speed,
            help="pace relative to the original run; 0 writes as fast as it can [%(default)s]")
    numeric(p, "--interval", type=float, minimum=0, help="seconds between batches, instead of the original pace")
    numeric(p, "--mbases-per-s", type=float, minimum=0,
            help="pace set by each batch's bases, instead of the original pace (24: a PromethION 48)")
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
    numeric(p, "-t", "--threads", type=int, minimum=1, default=1,
            help="with --stage-only: processes writing the batch files at once [%(default)s]")


def run(args: argparse.Namespace) -> int:
    opts = ReplayOptions(speed=args.speed, interval=args.interval, mbases_per_s=args.mbases_per_s,
                         batch_reads=args.batch_reads, mode=args.mode, write_seconds=args.write_seconds,
                         basecall_lag=args.basecall_lag, bam=args.bam, compression=args.compression,
                         signal_format=args.signal_format, flowcell=args.flowcell)  # fmt: skip
    if args.threads > 1 and not args.stage_only:
        raise UsageError("-t/--threads is for --stage-only: a replay on a pace lands its files one by one")
    staged = load_staged(args.finished_run)
    if staged is not None:
        if args.stage_only or args.mode == "inplace":
            raise UsageError(f"{args.finished_run} is staged already: it is moved in, not written")
        log.info("moving %d staged batches into %s", len(staged.timings), args.live_dir)
        run_dir, pace = replay_staged(staged, args.live_dir, opts, keep=args.keep_staged)
    else:
        src = load_source(args.finished_run)
        if args.stage_only:
            print(stage(src, args.live_dir, opts, workers=args.threads))
            return 0
        replayer = Replayer(src, args.live_dir, opts)
        log.info("replaying %d reads in %d batches into %s", len(src.reads), len(replayer.batches), replayer.run_dir)
        run_dir, pace = replayer.run(), replayer.pace
    print(run_dir)
    _report(pace)
    return 0


def _report(pace: Pace) -> None:
    print(pace.line(), file=sys.stderr)
    if pace.warning():
        log.warning("%s", pace.warning())
