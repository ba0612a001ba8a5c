"""`streamer meth-freq`: per-site methylation frequency from call-methylation TSV (like `f5c meth-freq`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamer_plugins.methfreq import CALL_THRESHOLD, MethFreq

NAME = "meth-freq"
HELP = "per-site methylation frequency from call-methylation TSV"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calls", type=Path, help="call-methylation TSV")
    p.add_argument("-c", "--call-threshold", type=float, default=CALL_THRESHOLD,
                   help="a call counts if |log_lik_ratio| >= this [%(default)s]")
    p.add_argument("-s", "--split-groups", action="store_true", help="report each CpG of a multi-CpG group separately")
    p.add_argument("-o", "--output", type=Path, help="output TSV (default: stdout)")


def run(args: argparse.Namespace) -> int:
    freq = MethFreq.from_tsv(args.calls, args.call_threshold, args.split_groups)
    if args.output:
        with open(args.output, "w") as fh:
            freq.write(fh)
    else:
        freq.write(sys.stdout)
    return 0
