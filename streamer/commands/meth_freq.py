"""`streamer meth-freq`: per-site methylation frequency from call-methylation TSV (like `f5c meth-freq`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamer.commands._checks import check_files, check_writable, numeric, removed_on_failure
from streamer.errors import InputError
from streamer.sinks import open_sink

NAME = "meth-freq"
HELP = "per-site methylation frequency from call-methylation TSV"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calls", type=Path, help="call-methylation TSV")
    numeric(p, "-c", "--call-threshold", key="output.call_threshold",
            help="a call counts if |log_lik_ratio| >= this [f5c's: 2.5]")
    p.add_argument("-s", "--split-groups", action="store_true", help="report each CpG of a multi-CpG group separately")
    p.add_argument("-o", "--output", type=Path, help="output TSV (default: stdout)")


def run(args: argparse.Namespace) -> int:
    threshold = {} if args.call_threshold is None else {"call_threshold": args.call_threshold}
    check_files(calls=args.calls)
    check_writable(**{"-o/--output": args.output})
    freq = open_sink("methfreq", split_groups=args.split_groups, **threshold).table
    try:
        freq.read(args.calls)
    except UnicodeDecodeError:
        raise InputError(args.calls, "not a call-methylation TSV (binary content): give the TSV that "
                                     "`streamer call` writes") from None
    if args.output:
        with removed_on_failure(args.output), open(args.output, "w") as fh:
            freq.write(fh)
    else:
        freq.write(sys.stdout)
    return 0
