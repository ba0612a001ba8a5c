"""`streamer meth-freq`: per-site methylation frequency from call-methylation TSV (like `f5c meth-freq`).

The calls are read back and counted by the sinks, as the daemon's start-up replays `meth.tsv`
into its `meth-freq.tsv` (`streamer.sinks.replay`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from streamer.commands._checks import check_files, check_writable, numeric, removed_on_failure
from streamer.config import Config, OutputConfig
from streamer.errors import InputError
from streamer.sinks import SinkContext, open_sinks, replay

NAME = "meth-freq"
HELP = "per-site methylation frequency from call-methylation TSV"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calls", type=Path, help="call-methylation TSV")
    numeric(p, "-c", "--call-threshold", key="output.call_threshold",
            help="a call counts if |log_lik_ratio| >= this [f5c's: 2.5]")
    p.add_argument("-s", "--split-groups", action="store_true", help="report each CpG of a multi-CpG group separately")
    p.add_argument("-o", "--output", type=Path, help="output TSV (default: stdout)")


def run(args: argparse.Namespace) -> int:
    check_files(calls=args.calls)
    check_writable(**{"-o/--output": args.output})
    output = replace(OutputConfig(), split_groups=args.split_groups)
    if args.call_threshold is not None:
        output = replace(output, call_threshold=args.call_threshold)
    with removed_on_failure(args.output):
        sinks = open_sinks(Config(output=output), SinkContext(NAME, files={"methfreq": args.output or sys.stdout}))
        try:
            replay(sinks, lambda rows: args.calls)
            for sink in sinks:
                sink.refresh(final=True)
        except UnicodeDecodeError:
            raise InputError(args.calls, "not a call-methylation TSV (binary content): give the TSV that "
                                         "`streamer call` writes") from None
        finally:
            for sink in sinks:
                sink.close()
    return 0
