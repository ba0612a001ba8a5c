"""What the daemon reports: summary.json's content, the status behind heartbeats and `streamer
status`, and the one-line status for systemd, all read from the ledger and the daemon's state
as of the last commit."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from streamer.metrics import status_of
from streamer.sinks import write_atomic

SUMMARY_JSON = "summary.json"


class Reported(Protocol):
    """What a report reads of `streamer.daemon.shell.Daemon`."""

    config: Any
    state: Any  # `State`
    ending: Any  # `streamer.daemon.policy.Ending` once the run loop ended
    failure: BaseException | None
    ledger: Any  # `streamer.daemon.ledger.Ledger`
    sinks: list[Any]
    published_on: dict[str, Any] | None
    cache: Any  # `streamer.daemon.basecall_cache.BasecallCache`
    tuner: Any
    aligning: Any  # `streamer.daemon.batches.Aligning`
    profile: dict[str, Any] | None  # `streamer.tuning.Plan.as_dict`
    started_at: float  # wall clock
    started: float  # monotonic


def summary(d: Reported) -> dict[str, Any]:
    """What summary.json holds: counts, skipped reads by reason, rejected files, throughput, latency."""
    counters = d.ledger.counters()
    totals = d.ledger.batch_totals()
    busy = totals["seconds"]
    return {
        "state": d.state.value,
        "ending": d.ending.reason if d.ending else None,
        "error": f"{type(d.failure).__name__}: {d.failure}" if d.failure else None,
        "watch_dir": str(d.config.watch.dir),
        "started": _iso(d.started_at),
        "updated": _iso(time.time()),
        "reads": d.ledger.read_counts() | {"called": counters.get("reads_called", 0),
                                           "recovered": d.ledger.recovered()},
        "records": {
            "considered": counters.get("records_in", 0),
            "called": counters.get("records_called", 0),
            "skipped_by_reason": {k.split(".", 1)[1]: v for k, v in counters.items() if k.startswith("skipped.")},
        },
        "calls": counters.get("calls", 0),
        "bases": counters.get("bases", 0),
        "eventalign_rows": counters.get("eventalign_rows", 0) if d.config.eventalign.enabled else None,
        "modbam": None,
        "modcalls": None,
        **{k: v for sink in d.sinks for k, v in sink.summary().items()},
        "publish": d.published_on,
        "files": d.ledger.file_counts(),
        "rejected_files": [{"path": p, "kind": k, "reason": r} for p, k, r in d.ledger.rejected_files()],
        "throughput": {
            "batches": totals["batches"],
            "busy_s": round(busy, 3),
            "bases_per_busy_s": round(totals["bases"] / busy, 1) if busy else 0.0,
            "uptime_s": round(time.monotonic() - d.started, 3),
        },
        "latency_s": {
            "mean": round(totals["latency_sum"] / totals["reads"], 3) if totals["reads"] else None,
            "max": round(totals["latency_max"], 3),
        },
        "basecall_reloads": d.cache.reloads,
        "alignment_engine": d.aligning.choice(),
        "tuning": d.tuner.summary() if d.tuner is not None else None,
        "profile": d.profile,
        "config": d.config.as_dict(),
    }


def write_summary(out_dir: Path, content: dict[str, Any]) -> None:
    write_atomic(out_dir / SUMMARY_JSON, json.dumps(content, indent=2) + "\n")


def status(content: dict[str, Any], files_pending: int) -> dict[str, Any]:
    """The counts behind the STATUS line, the publisher's status and the metrics (`streamer.metrics.status_of`)."""
    return {**status_of(content), "files_pending": files_pending}


def status_line(state: str, s: dict[str, Any]) -> str:
    if not s:
        return state
    return (f"{s['state']}: {s['done']} reads done ({s['reads_called']} called), {s['matched']} queued, "
            f"{s['waiting_for_signal'] + s['waiting_for_basecalls']} waiting for a partner file, "
            f"{s['calls']} calls, {s['files_rejected']} files set aside")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")
