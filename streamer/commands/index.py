"""`streamer index`: build the read id -> signal file index beside the reads file (like `f5c index`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from streamer.io.index import SignalIndex, index_path_for
from streamer.io.signal import find_signal_files

NAME = "index"
HELP = "index the signal files of a reads file (read id -> signal file)"

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("reads", type=Path, help="basecalls (FASTA/FASTQ) the index belongs to")
    p.add_argument("-d", "--directory", action="append", required=True, metavar="DIR_OR_FILE",
                   help="a signal file or folder to scan (repeat for more)")


def run(args: argparse.Namespace) -> int:
    files = find_signal_files(args.directory)
    idx = SignalIndex.build(files)
    out = index_path_for(args.reads)
    idx.save(out)
    for path, reason in idx.bad_files.items():
        log.warning("%s: unreadable signal file: %s", path, reason)
    log.info("indexed %d reads in %d signal files (%d unreadable) -> %s", len(idx), len(files), len(idx.bad_files), out)
    return 0
