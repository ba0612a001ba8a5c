"""`streamer validate-config`: check a configuration file before a daemon is started with it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamer import config

NAME = "validate-config"
HELP = "check a streamer run configuration file (exit 78 when it is invalid)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, nargs="?", help="YAML configuration to check")
    p.add_argument("--require", action="store_true",
                   help="also require the keys `streamer run` needs (watch.dir, reference.genome, output.dir); "
                   "leave it off for files completed by flags, as the systemd template does")
    p.add_argument("--defaults", action="store_true", help="print the documented defaults file and exit")


def run(args: argparse.Namespace) -> int:
    if args.defaults:
        sys.stdout.write(config.render_defaults())
        return 0
    if args.file is None:
        print("streamer validate-config: give a FILE (or --defaults)", file=sys.stderr)
        return 2
    config.load(args.file, require=config.REQUIRED_FOR_RUN if args.require else ())
    print(f"{args.file}: ok")
    return 0
