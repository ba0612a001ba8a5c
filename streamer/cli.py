"""The `streamer` command: one sub-command per module in `streamer.commands`, plus those that
installed packages register in the `streamer.commands` entry-point group (a plugin's command
without the core importing the plugin; a core command keeps its name).

Each command module defines `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`.
Errors that streamer raises on purpose print one line and exit non-zero; set
`STREAMER_DEBUG=1` to see the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import os
import pkgutil
import sys

import streamer
import streamer.commands
from streamer.errors import ConfigError, StreamerError

EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h: systemd units do not restart on it


def _command_modules():
    for info in sorted(pkgutil.iter_modules(streamer.commands.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"streamer.commands.{info.name}")


def _plugin_command_modules(taken: set[str]):
    for ep in sorted(importlib.metadata.entry_points(group="streamer.commands"), key=lambda e: e.name):
        if ep.name in taken:
            continue
        try:
            yield ep.load()
        except ImportError as exc:  # a broken plugin costs its own command, not the others
            print(f"streamer: command {ep.name!r} ({ep.value}) is unavailable: {exc}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamer", description=streamer.__doc__)
    parser.add_argument("--version", action="version", version=f"streamer {streamer.__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    core = list(_command_modules())
    for mod in core + list(_plugin_command_modules({m.NAME for m in core})):
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose + 1, 2)
    logging.basicConfig(level=level, format="[%(asctime)s %(name)s] %(levelname)s: %(message)s", stream=sys.stderr)
    try:
        return args._run(args)
    except ConfigError as exc:
        if os.environ.get("STREAMER_DEBUG"):
            raise
        print(f"streamer {args.command}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StreamerError as exc:
        if os.environ.get("STREAMER_DEBUG"):
            raise
        print(f"streamer {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
