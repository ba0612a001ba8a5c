"""`streamer meth-freq`: per-site methylation frequency from call-methylation TSV (like `f5c meth-freq`, or with
`--compat nanopolish` nanopolish's calculate_methylation_frequency.py).

The calls are read back and counted by the sinks, as the daemon's start-up replays `meth.tsv`
into its `meth-freq.tsv` (`streamer.sinks.replay`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from streamer.commands._checks import check_files, check_writable, numeric, removed_on_failure
from streamer.config import Config, OutputConfig, PipelineConfig
from streamer.errors import InputError
from streamer.pore.motifs import CPG, MOTIFS
from streamer.sinks import SinkContext, open_sinks, replay

NANOPOLISH_CALL_THRESHOLD = 2.0  # calculate_methylation_frequency.py's default, per site of a group

NAME = "meth-freq"
HELP = "per-site methylation frequency from call-methylation TSV"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calls", type=Path, help="call-methylation TSV")
    numeric(p, "-c", "--call-threshold", key="output.call_threshold",
            help="a call counts if |log_lik_ratio| >= this [f5c's: 2.5; with --compat nanopolish, 2.0 per site of "
                 "the group]")
    p.add_argument("-s", "--split-groups", action="store_true",
                   help="report each site of a group of several separately")
    p.add_argument("-q", "--methylation", choices=tuple(MOTIFS), default=CPG.name,
                   help="the motif the calls are of, whose sites -s splits a group into [%(default)s]")
    p.add_argument("--compat", choices=("f5c", "nanopolish"), default="f5c",
                   help="whose counting rule: f5c meth-freq's, or nanopolish's calculate_methylation_frequency.py "
                        "(the threshold times the group's sites) [%(default)s]")
    p.add_argument("-o", "--output", type=Path, help="output TSV (default: stdout)")


def run(args: argparse.Namespace) -> int:
    check_files(calls=args.calls)
    check_writable(**{"-o/--output": args.output})
    output = replace(OutputConfig(), split_groups=args.split_groups, freq_compat=args.compat)
    if args.call_threshold is not None or args.compat == "nanopolish":
        threshold = args.call_threshold if args.call_threshold is not None else NANOPOLISH_CALL_THRESHOLD
        output = replace(output, call_threshold=threshold)
    with removed_on_failure(args.output):
        config = Config(pipeline=replace(PipelineConfig(), methylation=args.methylation), output=output)
        sinks = open_sinks(config, SinkContext(NAME, files={"methfreq": args.output or sys.stdout}))
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
