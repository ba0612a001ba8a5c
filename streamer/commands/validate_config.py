"""`streamer validate-config`: check a configuration file before a daemon is started with it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamer import config

NAME = "validate-config"
HELP = ("check a configuration as `streamer run --config FILE [flags]` would, given the same flags "
        "(exit 78 when it is invalid)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, nargs="?", help="YAML configuration to check")
    p.add_argument("--defaults", action="store_true", help="print the documented defaults file and exit")
    config.add_flags(p)


def run(args: argparse.Namespace) -> int:
    if args.defaults:
        sys.stdout.write(config.render_defaults())
        return 0
    if args.file is None:
        print("streamer validate-config: give a FILE (or --defaults)", file=sys.stderr)
        return 2
    config.load(args.file, config.overrides_from(args))  # exactly what `streamer run` checks
    print(f"{args.file}: ok")
    return 0
