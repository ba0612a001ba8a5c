"""What a `streamer call --trace` timeline says: per thread, how busy it was and with what; per stage,
its summed seconds; how long the compute threads sat with no batch (the run's pipeline bubbles); and
when the run's memory peaked.

    python benchmarks/timeline_report.py run.trace.json [more.trace.json ...]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the (start, end) spans."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def summarise(path: Path) -> dict:
    every = json.loads(path.read_text())["traceEvents"]
    events = [e for e in every if e["ph"] == "X"]
    memory = sorted((e["ts"], sum(e["args"].values()), e["args"]) for e in every if e["name"] == "memory MB")
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e["dur"] for e in events)
    wall = (t1 - t0) / 1e6
    stages: Counter = Counter()
    threads: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        stages[e["name"]] += e["dur"] / 1e6
        kind = "readers (any)" if e["name"] == "read" else e["tid"].split(" ", 1)[-1]
        threads[kind].append((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
    busy = {k: union_seconds(v) for k, v in threads.items()}
    batches = sorted((e["ts"], e["dur"]) for e in events if e["name"] == "batch")
    first_batch = (batches[0][0] - t0) / 1e6 if batches else 0.0
    last_batch_end = (max(a + d for a, d in batches) - t0) / 1e6 if batches else 0.0
    compute = [(a / 1e6, (a + d) / 1e6) for a, d in batches]
    return {"trace": path.name, "wall_s": wall, "batches": len(batches), "first_batch_starts_s": first_batch,
            "last_batch_ends_s": last_batch_end, "some_batch_computing_s": union_seconds(compute),
            "stage_s": dict(sorted(stages.items())), "thread_busy_s": dict(sorted(busy.items())),
            **peak_memory(memory, t0)}


def peak_memory(samples: list[tuple[float, float, dict]], t0: float) -> dict:
    """The largest summed PSS sampled (`memory MB`), when (seconds from the first span) and by whom; {} if none."""
    if not samples:
        return {}
    ts, mb, series = max(samples, key=lambda s: s[1])
    return {"peak_memory_mb": mb, "peak_memory_at_s": (ts - t0) / 1e6, "peak_memory_by": series}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true", help="print JSON rather than text")
    args = ap.parse_args()
    for path in args.traces:
        s = summarise(path)
        if args.json:
            print(json.dumps(s))
            continue
        print(f"{s['trace']}: {s['wall_s']:.2f} s traced, {s['batches']} batches; the first batch computes from "
              f"{s['first_batch_starts_s']:.2f} s, the last ends at {s['last_batch_ends_s']:.2f} s; some batch "
              f"computing {s['some_batch_computing_s']:.2f} s"
              + (f"; peak memory {s['peak_memory_mb']:.0f} MB at {s['peak_memory_at_s']:.2f} s ("
                 + ", ".join(f"{k} {v}" for k, v in s["peak_memory_by"].items()) + ")" if s.get("peak_memory_mb") else ""))
        print("  stages (summed s): " + ", ".join(f"{k} {v:.2f}" for k, v in s["stage_s"].items()))
        print("  busy (s, union of spans): " + ", ".join(f"{k} {v:.2f}" for k, v in s["thread_busy_s"].items()))


if __name__ == "__main__":
    main()
