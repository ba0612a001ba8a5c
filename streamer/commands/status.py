"""`streamer status [OUTDIR|ENDPOINT]`: what a daemon is doing or did.

From an output folder it reads `summary.json` (rewritten every `output.refresh_interval` and at
the end); from a publisher's endpoint it waits for the next status heartbeat, whose counters are
current as of the last committed batch. Both give the same fields (`streamer.metrics.status_of`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from streamer.commands._checks import numeric
from streamer.config import is_endpoint
from streamer.errors import InputError, StreamerError
from streamer.metrics import render, status_of

NAME = "status"
HELP = "what a running or finished daemon is doing: state, reads, calls, throughput, latency, last error"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("where", nargs="?", default=".", metavar="OUTDIR|ENDPOINT",
                   help="the daemon's output folder (its summary.json), or its --publish endpoint, e.g. "
                        "tcp://127.0.0.1:5556 [the current folder]")
    p.add_argument("--json", action="store_true", help="the status as one JSON object")
    numeric(p, "--heartbeat-interval", key="publish.heartbeat_interval", default=2.0, metavar="S",
            help="with an ENDPOINT: the publisher's heartbeat interval; three without one is an error [2]")


def run(args: argparse.Namespace) -> int:
    status = _from_stream(args.where, args.heartbeat_interval) if is_endpoint(args.where) else _from_folder(Path(args.where))
    print(json.dumps(status) if args.json else render(status))
    return 0


def _from_folder(out: Path) -> dict[str, Any]:
    path = out / "summary.json" if out.is_dir() else out
    if not path.is_file():
        raise InputError(path, "no such file: give the daemon's output folder (output.dir), or its publish endpoint")
    try:
        return status_of(json.loads(path.read_text()))
    except (ValueError, AttributeError) as exc:
        raise InputError(path, f"not a daemon's summary.json ({exc})") from None


def _from_stream(endpoint: str, interval: float) -> dict[str, Any]:
    from streamer.publish.client import Subscriber
    from streamer.publish.messages import Status
    from streamer.publish.protocol import Topic

    with Subscriber(endpoint, [Topic.STATUS], snapshot=False, heartbeat_interval=interval) as sub:
        for msg in sub:
            if isinstance(msg, Status) and msg.counters:
                return dict(msg.counters)
    raise StreamerError(f"{endpoint}: the publisher closed before sending its counters")
