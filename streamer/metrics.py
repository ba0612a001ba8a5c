"""What a daemon is doing, as flat numbers: one projection of `summary.json`, used by the status
heartbeats, `streamer status` and the Prometheus endpoint (`streamer run --metrics`), so the
three cannot disagree.

`status_of` is pure; `serve_metrics` exposes the latest status in Prometheus' text format
(`prometheus-client`), counters as `streamer_*_total` and the rest, the tuning monitor's current
settings and the device profile's limits among them, as gauges (the profile, the board and the limits
that are words, such as the CUDA streams' priority, as `streamer_profile_info`'s labels).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)

# name in the status, help; all grow only while a run goes on (Prometheus counters)
COUNTERS = {
    "done": "reads done (called, or skipped with a reason)",
    "reads_called": "reads called",
    "calls": "call rows written to meth.tsv",
    "bases": "read bases sent through the pipeline",
    "batches": "batches committed",
    "busy_s": "seconds the pipeline spent on batches",
    "files_rejected": "files set aside as truncated, corrupt or unreadable",
}
GAUGES = {
    "matched": "reads with both partner files, waiting for a batch",
    "waiting_for_signal": "reads with basecalls, waiting for their signal file",
    "waiting_for_basecalls": "reads with signal, waiting for their basecalls",
    "bases_per_busy_s": "bases per second of pipeline time",
    "latency_mean_s": "mean seconds from a read's files landing to its calls being committed",
    "latency_max_s": "most seconds from a read's files landing to its calls being committed",
    "uptime_s": "seconds since the daemon started",
}
TUNING = ("max_reads", "max_bases", "max_lf", "max_epk", "avg_epk", "ultra_thresh")
# the limits a device profile sets (`streamer.tuning.Plan.limits`), as the run started; help for the known ones
LIMITS = {
    "max_reads": "reads per batch (K) the run started with",
    "max_bases": "bases per batch (B) the run started with",
    "max_lf": "longest read, as a multiple of the batch's mean, the GPU takes",
    "max_epk": "most events per k-mer the GPU takes",
    "avg_epk": "events per k-mer the GPU arena is sized for",
    "ultra_thresh": "bases above which a read goes to the CPU",
    "threads": "CPU threads",
    "mem_frac": "share of free GPU memory the arena may take",
    "memory_budget": "bytes of memory the run is sized for (host, and GPU where unified)",
    "unified_memory": "1 where host and GPU are one memory (a Jetson's) and the budget holds both",
    "gpu_reserve": "device bytes never taken (left to a co-resident basecaller)",
    "gpu_memory": "most device bytes the GPU stages take (on a Jetson, the budget's share)",
}
STATES = ("new", "running", "finishing", "finished", "stopped", "failed")


def status_of(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The flat status of a daemon from what its `summary.json` holds."""
    reads, put, latency = summary.get("reads", {}), summary.get("throughput", {}), summary.get("latency_s", {})
    status: dict[str, Any] = {
        "state": summary.get("state"),
        "done": reads.get("done", 0),
        "reads_called": reads.get("called", 0),
        "matched": reads.get("matched", 0),
        "waiting_for_signal": reads.get("waiting_for_signal", 0),
        "waiting_for_basecalls": reads.get("waiting_for_basecalls", 0),
        "calls": summary.get("calls", 0),
        "bases": summary.get("bases", 0),
        "batches": put.get("batches", 0),
        "busy_s": put.get("busy_s", 0.0),
        "bases_per_busy_s": put.get("bases_per_busy_s", 0.0),
        "latency_mean_s": latency.get("mean") or 0.0,
        "latency_max_s": latency.get("max", 0.0),
        "uptime_s": put.get("uptime_s", 0.0),
        "files_rejected": len(summary.get("rejected_files", ())),
        "error": summary.get("error"),
    }
    settings = (summary.get("tuning") or {}).get("settings") or {}
    status.update({f"tuning_{k}": settings[k] for k in TUNING if k in settings})
    profile = summary.get("profile") or {}
    if profile:
        status.update({"profile": profile.get("name"), "board": profile.get("board")})
        status.update({f"limit_{k}": v for k, v in (profile.get("limits") or {}).items()})
    return status


def combined(statuses: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The status of several runs in one daemon as one: counts summed, the slowest latency, the
    state of the run furthest from done (running before finished), the first error."""
    if not statuses:
        return {}
    out: dict[str, Any] = {name: sum(s[name] for s in statuses) for name in (*COUNTERS, "matched",
                                                                             "waiting_for_signal",
                                                                             "waiting_for_basecalls")}
    out["bases_per_busy_s"] = out["bases"] / out["busy_s"] if out["busy_s"] else 0.0
    called = [s for s in statuses if s["reads_called"]]
    out["latency_mean_s"] = (sum(s["latency_mean_s"] * s["reads_called"] for s in called) / out["reads_called"]
                             if called else 0.0)
    out["latency_max_s"] = max(s["latency_max_s"] for s in statuses)
    out["uptime_s"] = max(s["uptime_s"] for s in statuses)
    order = ("failed", "running", "finishing", "new", "stopped", "finished")
    out["state"] = min((s["state"] for s in statuses), key=lambda x: order.index(x) if x in order else len(order))
    out["error"] = next((s["error"] for s in statuses if s.get("error")), None)
    out.update({k: v for k, v in statuses[0].items() if k in ("profile", "board") or k.startswith("limit_")})
    return out


def render(status: Mapping[str, Any]) -> str:
    """The status as `streamer status` prints it: one line, then one line per group."""
    s = status
    lines = [
        f"state: {s['state']}" + (f" (error: {s['error']})" if s.get("error") else ""),
        f"reads: {s['done']} done ({s['reads_called']} called), {s['matched']} queued, "
        f"{s['waiting_for_signal'] + s['waiting_for_basecalls']} waiting for a partner file",
        f"calls: {s['calls']}; bases: {s['bases']} in {s['batches']} batches",
        f"throughput: {s['bases_per_busy_s']:.0f} bases/s of pipeline time ({s['busy_s']:.1f} s busy, "
        f"up {s['uptime_s']:.0f} s)",
        f"latency: mean {s['latency_mean_s']:.2f} s, max {s['latency_max_s']:.2f} s (files landing to calls "
        "committed)",
        f"files set aside: {s['files_rejected']}",
    ]
    tuning = {k.removeprefix("tuning_"): v for k, v in s.items() if k.startswith("tuning_")}
    if tuning:
        lines.append("tuning: " + ", ".join(f"{k} {v:g}" for k, v in tuning.items()))
    if s.get("profile"):
        limits = {k.removeprefix("limit_"): v for k, v in s.items() if k.startswith("limit_")}
        lines.append(f"profile: {s['profile']}" + (f" on {s['board']}" if s.get("board") else "") + "; limits: "
                     + ", ".join(f"{k} {_shown(v)}" for k, v in limits.items()))
    return "\n".join(lines)


def _shown(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value) if isinstance(value, (str, int)) else format(value, "g")


class _Collector:
    """Prometheus families from the latest status, read at each scrape."""

    def __init__(self, current: Callable[[], Mapping[str, Any]]):
        self.current = current

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.current()
        if not s:
            return
        for name, help in COUNTERS.items():
            yield CounterMetricFamily(f"streamer_{name}", help, value=s[name])
        for name, help in GAUGES.items():
            yield GaugeMetricFamily(f"streamer_{name}", help, value=s[name])
        state = GaugeMetricFamily("streamer_state", "1 for the daemon's state", labels=["state"])
        for name in STATES:
            state.add_metric([name], float(s["state"] == name))
        yield state
        for name in TUNING:
            if f"tuning_{name}" in s:
                yield GaugeMetricFamily(f"streamer_tuning_{name}", f"the tuning monitor's current {name}",
                                        value=s[f"tuning_{name}"])
        words = {k.removeprefix("limit_"): v for k, v in s.items() if k.startswith("limit_") and isinstance(v, str)}
        if s.get("profile"):
            info = GaugeMetricFamily("streamer_profile_info", "1 for the device profile the run started from, the "
                                     "Jetson board that chose it and its limits that are words",
                                     labels=["profile", "board", *words])  # fmt: skip
            info.add_metric([s["profile"], s.get("board") or "", *words.values()], 1.0)
            yield info
        for key, value in s.items():
            name = key.removeprefix("limit_")
            if key.startswith("limit_") and value is not None and name not in words:
                yield GaugeMetricFamily(f"streamer_limit_{name}", f"{name} as the run started (the device profile's "
                                        f"unless configured): " + LIMITS.get(name, name), value=value)


def parse_address(address: str) -> tuple[str, int]:
    """`PORT` or `HOST:PORT` (loopback when no host is given)."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r}: expected PORT or HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def serve_metrics(address: str, current: Callable[[], Mapping[str, Any]]) -> Callable[[], None]:
    """Serve `current()` for Prometheus at http://ADDRESS/metrics; returns the function that stops it."""
    from prometheus_client import CollectorRegistry, start_http_server

    host, port = parse_address(address)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(current))
    server, thread = start_http_server(port, host, registry=registry)
    log.info("metrics for Prometheus at http://%s:%d/metrics", host, server.server_port)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop
