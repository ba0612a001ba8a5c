"""`streamer subscribe ENDPOINT`: print a publisher's messages as JSON lines.

One line per message: the header fields (topic, run, seq, time_ns) then the
payload, columns as lists. A gap prints as {"gap": {...}}. It ends when the
publisher closes, and fails when the publisher goes silent.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from streamer.publish.client import Gap, Subscriber
from streamer.commands._checks import numeric
from streamer.config import is_endpoint
from streamer.errors import ConfigError, UsageError
from streamer.publish.protocol import Topic
from streamer.publish.security import CurveClient, load_keys, load_secret_keys

NAME = "subscribe"
HELP = "print a running streamer's results (ZeroMQ) as JSON lines"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("endpoint", help="publisher endpoint, e.g. tcp://127.0.0.1:5556")
    parser.add_argument("--topic", action="append", default=[],
                        help=f"topic prefix to follow, repeatable (default: all of {', '.join(Topic)})")
    parser.add_argument("--snapshot-endpoint", help="snapshot endpoint (default: as the publisher announces it)")
    parser.add_argument("--no-snapshot", action="store_true", help="do not fetch per-site frequencies on joining")
    numeric(parser, "--heartbeat-interval", key="publish.heartbeat_interval", default=2.0, metavar="S",
            help="assumed until the first heartbeat says otherwise (default 2)")
    parser.add_argument("--client-key", type=Path, metavar="FILE", help="our CURVE key (NAME.key_secret)")
    parser.add_argument("--server-key", type=Path, metavar="FILE", help="the publisher's public CURVE key (NAME.key)")


def run(args: argparse.Namespace) -> int:
    for flag, endpoint in (("ENDPOINT", args.endpoint), ("--snapshot-endpoint", args.snapshot_endpoint)):
        if endpoint is not None and not is_endpoint(endpoint):
            raise UsageError(f"{flag}: {endpoint!r} is not a ZeroMQ endpoint (tcp://HOST:PORT, ipc://PATH)")
    curve = None
    if args.client_key or args.server_key:
        if not (args.client_key and args.server_key):
            raise ConfigError("CURVE needs both --client-key and --server-key")
        curve = CurveClient(load_secret_keys(args.client_key), load_keys(args.server_key).public)
    with Subscriber(args.endpoint, args.topic, snapshot=not args.no_snapshot,
                    snapshot_endpoint=args.snapshot_endpoint, heartbeat_interval=args.heartbeat_interval,
                    curve=curve) as sub:
        try:
            for msg in sub:
                print(json.dumps(to_json(msg), default=str), flush=True)
        except BrokenPipeError:  # `| head`: the reader has seen enough
            sys.stderr.close()
    return 0


def to_json(msg: Any) -> dict[str, Any]:
    if isinstance(msg, Gap):
        return {"gap": dataclasses.asdict(msg)}
    header = msg.header
    out = {"topic": header.topic, "run": header.run_id, "seq": header.seq, "time_ns": header.time_ns}
    out.update((f.name, _plain(getattr(msg, f.name))) for f in dataclasses.fields(msg) if f.name != "header")
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value
