"""What `jetson_emulation.py` makes of a trial's samples: the backlog over time and whether it grows, the
latency per batch file, the time per batch, peak memory against the budget, and the markdown table. Pure
functions over plain data, so they are tested without a GPU (tests/test_jetson_emulation.py).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from streamer.daemon.replay_plan import BatchTiming, ReplayOptions, landing_times

# a backlog that grows by less than this share of the landing rate (reads/s) is noise, not a trend
GROWTH_TOLERANCE = 0.05
PROGRESS_STEP = 0.05  # seconds between the backlog's points, rebuilt from the ledger (`progress`)


def stagger(cells: Sequence[Mapping[str, Any]], pace: float) -> list[float]:
    """Seconds after the first that each cell's replay starts: spread over one file's time, so that the
    cells' files land in turn, as flow cells started apart do, not all at once."""
    per_cell = pace / len(cells) * 1e6
    first = statistics.fmean(c["bases"][0] for c in cells) / per_cell if per_cell > 0 else 0.0
    return [i * first / len(cells) for i in range(len(cells))]


def landings(cells: Sequence[Mapping[str, Any]], pace: float, offsets: Sequence[float] = ()) -> list[tuple[float, int]]:
    """(seconds after the replays start, reads) of every batch file of every cell, in time order, each
    cell at pace / cells Mbases/s (the plan `streamer replay --mbases-per-s` follows) from its offset."""
    opts = ReplayOptions(mbases_per_s=pace / len(cells))
    out = []
    for cell, at in zip(cells, offsets or [0.0] * len(cells)):
        times = landing_times([BatchTiming(0.0, b) for b in cell["bases"]], opts)
        out.extend((at + t, n) for t, n in zip(times, cell["reads"]))
    return sorted(out)


def backlog(samples: Sequence[Mapping[str, Any]], landed: Sequence[tuple[float, int]]) -> list[dict[str, float]]:
    """Per sample (t: seconds after the replays start, done: reads the daemon has done), the reads landed
    by then and the backlog: landed and not yet done."""
    out, i, total = [], 0, 0
    for s in samples:
        while i < len(landed) and landed[i][0] <= s["t"]:
            total += landed[i][1]
            i += 1
        out.append({"t": s["t"], "landed": total, "done": s["done"], "backlog": total - s["done"]})
    return out


def progress(commits: Iterable[tuple[float, int]], step: float = PROGRESS_STEP) -> list[dict[str, float]]:
    """Reads done over time, from the ledger's commits ((seconds after the replays start, reads) each):
    a sample every `step` seconds up to the last commit. Exact where the daemon's status, written once a
    second, is not: a trough of the backlog is the moment before its file lands."""
    commits = sorted(commits)
    out, i, done = [], 0, 0
    end = commits[-1][0] if commits else 0.0
    for k in range(int(end / step) + 2):
        t = k * step
        while i < len(commits) and commits[i][0] <= t:
            done += commits[i][1]
            i += 1
        out.append({"t": t, "done": done})
    return out


def growth(series: Sequence[Mapping[str, float]], landed: Sequence[tuple[float, int]]) -> dict[str, Any]:
    """Whether the backlog grows while files land, and how long the daemon took to finish after the last
    file landed (None: it did not within the samples).

    The backlog is a sawtooth: it jumps by a file's reads as each lands and falls as they are done. Its
    troughs (the last sample before each landing) hold what the daemon has not caught up with: their
    least-squares slope (reads/s) over the second half of the landing time (all of them where that
    has fewer than 3; fewer than 3 in all tell no trend: 0) is set against the landing rate.
    """
    end = landed[-1][0] if landed else 0.0
    rate = sum(n for _, n in landed) / end if end > 0 else 0.0
    troughs = []
    for at in sorted({t for t, _ in landed}):
        before = [p for p in series if p["t"] < at]
        if before:
            troughs.append((before[-1]["t"], before[-1]["backlog"]))
    late = [p for p in troughs if p[0] >= end / 2]
    slope = _slope(late if len(late) >= 3 else troughs)
    finished = next((p["t"] for p in series if p["t"] >= end and p["backlog"] <= 0), None)
    return {"landing_s": end, "landing_reads_per_s": rate, "slope_reads_per_s": slope,
            "grows": slope > GROWTH_TOLERANCE * rate, "max_backlog": max((p["backlog"] for p in series), default=0),
            "drain_s": None if finished is None else finished - end}  # fmt: skip


def _kept(g: Mapping[str, Any]) -> float:
    """The share of the landing rate the daemon did while files landed: the rate less the backlog's slope."""
    rate = g["landing_reads_per_s"]
    return min(1.0, max(0.0, 1.0 - g["slope_reads_per_s"] / rate)) if rate else 1.0


def _slope(points: Sequence[tuple[float, float]]) -> float:
    if len(points) < 3:
        return 0.0
    mt = statistics.fmean(t for t, _ in points)
    mb = statistics.fmean(b for _, b in points)
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (b - mb) for t, b in points) / var if var else 0.0


def sustained(g: Mapping[str, Any], drain_limit: float) -> bool:
    """The pace was kept: the backlog did not grow and the daemon finished within drain_limit of the last file."""
    return not g["grows"] and g["drain_s"] is not None and g["drain_s"] <= drain_limit


def file_latencies(reads: Iterable[tuple[int, int, int]], registered: Mapping[int, float],
                   committed: Mapping[int, float]) -> list[float]:
    """Seconds from each signal file's reads having both their files registered to the commit of the last of
    them: reads as the ledger's (signal file, basecall file, batch) rows, registered and committed as its
    files' and batches' times (`at`)."""
    per_file: dict[int, float] = {}
    for sig, bc, batch in reads:
        wait = committed[batch] - max(registered[sig], registered[bc])
        per_file[sig] = max(per_file.get(sig, 0.0), wait)
    return list(per_file.values())


def landing_latencies(reads: Iterable[tuple[int, int, int]], landed: Mapping[int, float],
                      committed: Mapping[int, float]) -> list[float]:
    """Seconds from each signal file's landing to the commit of its last read: reads as the ledger's (signal
    file, basecall file, batch) rows, `landed` when each signal file landed (wall clock, `landed_at`),
    committed its batches' times (`at`). Unlike `file_latencies`, this counts the time a file waits to be
    taken into the ledger."""
    last: dict[int, float] = {}
    for sig, _, batch in reads:
        last[sig] = max(last.get(sig, 0.0), committed[batch])
    return [at - landed[sig] for sig, at in last.items()]


def lateness(landed: Mapping[int, float], names: Mapping[int, str], planned: Sequence[float]) -> list[float]:
    """Seconds each file landed after its cell's plan had it (`planned`: wall clock, by batch number; the
    replays' start-up): the commits are moved by their mean, so that the backlog counts reads landed
    when they really did."""
    return [at - planned[_batch_number(names[i])] for i, at in landed.items()]


def _batch_number(path: str) -> int:
    """A batch file's number, which ends its name, as MinKNOW and the replay write them."""
    return int(path.rpartition("/")[2].split(".")[0].rpartition("_")[2])


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    return {"files": len(seconds), "mean_s": statistics.fmean(seconds) if seconds else 0.0,
            "max_s": max(seconds, default=0.0)}  # fmt: skip


def batch_latency(files: Sequence[float], batches: Sequence[tuple[int, float, float]]) -> dict[str, float]:
    """Latency per batch file (mean, max) and per batch, the daemon's own (each batch's reads' mean from both
    files registered to commit, mean over batches; and the largest of any read): batches as the ledger's
    (n_reads, latency_sum, latency_max) rows."""
    means = [total / n for n, total, _ in batches if n]
    return {**latency_summary(files), "batches": len(batches), "batch_mean_s": statistics.fmean(means) if means else 0.0,
            "batch_max_s": max((m for _, _, m in batches), default=0.0)}  # fmt: skip


def batch_times(batches: Sequence[tuple[int, int, float]]) -> dict[str, Any]:
    """The daemon's seconds per batch, from taking its basecalls (and aligning those that came without) to
    its commit: batches as the ledger's (n_reads, bases, seconds) rows; each kept, and their spread."""
    secs = sorted(s for _, _, s in batches)
    total = sum(secs)

    def rank(q: float) -> float:
        return secs[min(len(secs) - 1, int(q * len(secs)))] if secs else 0.0

    return {"batches": len(secs), "reads": sum(n for n, _, _ in batches), "total_s": total,
            "mean_s": total / len(secs) if secs else 0.0, "p50_s": rank(0.5), "p90_s": rank(0.9), "max_s": rank(1.0),
            "mbases_per_s": sum(b for _, b, _ in batches) / 1e6 / total if total > 0 else 0.0,
            "per_batch": [[n, b, s] for n, b, s in batches]}  # fmt: skip


def row_difference(rows: Sequence[str], reference: Sequence[str]) -> dict[str, int]:
    """Rows of the daemon not in the reference's (`streamer call` with the BAM), and the reverse, as multisets."""
    mine, theirs = Counter(rows), Counter(reference)
    return {"daemon_only": sum((mine - theirs).values()), "call_only": sum((theirs - mine).values())}


def peak_memory(samples: Sequence[Mapping[str, Any]], budget: int, unified: bool) -> dict[str, Any]:
    """The largest host PSS, GPU memory and their sum over the samples, against the budget (bytes): of host
    and GPU together where they are one memory (a Jetson's profile), of the host alone beside a GPU of its own."""
    host = max((s["pss"] for s in samples), default=0)
    gpu = max((s["gpu"] for s in samples), default=0)
    both = max((s["pss"] + s["gpu"] for s in samples), default=0)
    return {"host_pss_mb": host / 2**20, "gpu_mb": gpu / 2**20, "sum_mb": both / 2**20, "unified": unified,
            "budget_mb": budget / 2**20, "within_budget": (both if unified else host) <= budget}  # fmt: skip


def period_change(alone: Mapping[str, Any], beside: Mapping[str, Any]) -> dict[str, float]:
    """The stand-in's period beside the daemon against alone: the ratio of means and of p50s, minus one."""
    return {k: beside["period"][f"{k}_ms"] / alone["period"][f"{k}_ms"] - 1 for k in ("mean", "p50", "p99")}


def markdown(res: Mapping[str, Any]) -> str:
    """The results as tables: the main trial, the stand-in's period, and the pace search."""
    m = res["main"]
    g, lat, mem = m["growth"], m["latency"], m["memory"]
    lines = [
        f"# Jetson emulation: {res['cells']} flow cells at {m['pace']:g} Mbases/s",
        "",
        f"Daemon on cores {res['daemon_cores']} (4 x86 cores standing for 6-8 slower Arm cores), profile "
        f"`{res['profile']}`, budget {res['budget']}, GPU cap {res['gpu_memory']}; {res['device']}.",
        *_basecalls(res, m),
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| replayed | {m['mbases']:.1f} Mbases in {g['landing_s']:.0f} s ({m['pace']:g} Mbases/s asked) |",
        f"| backlog slope (troughs, second half) | {g['slope_reads_per_s']:+.2f} reads/s of "
        f"{g['landing_reads_per_s']:.1f} landing: {'grows' if g['grows'] else 'does not grow'} |",
        f"| done while files land | {_kept(g):.0%} of the landing rate: about {_kept(g) * m['pace']:.1f} Mbases/s |",
        f"| largest backlog | {g['max_backlog']} reads |",
        f"| finished after the last file | {_s(g['drain_s'])} |",
        *([f"| latency per batch file, from its landing | mean {m['landing_latency']['mean_s']:.1f} s, max "
           f"{m['landing_latency']['max_s']:.1f} s |"] if m.get("landing_latency") else []),
        f"| latency per batch file, from its registration | mean {lat['mean_s']:.1f} s, max {lat['max_s']:.1f} s "
        f"({lat['files']} files) |",
        f"| latency per batch | mean {lat['batch_mean_s']:.1f} s, max {lat['batch_max_s']:.1f} s ({lat['batches']} "
        "batches; reads' files registered to commit) |",
        f"| peak host PSS + GPU | {mem['host_pss_mb']:.0f} + {mem['gpu_mb']:.0f} MB ("
        + (f"largest sum {mem['sum_mb']:.0f} MB" if mem.get("unified", True) else "the host's")
        + f" against the budget's {mem['budget_mb']:.0f}: {'within' if mem['within_budget'] else 'OVER'}) |",
        f"| rows identical to `streamer call` | {m['rows_identical']} ({m['rows']} rows{_diff(m.get('rows_diff'))}) |",
    ]
    if m.get("batch_times"):
        b = m["batch_times"]
        lines.insert(-1, f"| time per batch (ledger) | mean {b['mean_s']:.2f} s, p50 {b['p50_s']:.2f}, p90 "
                         f"{b['p90_s']:.2f}, max {b['max_s']:.2f} s ({b['batches']} batches, {b['reads']} reads; "
                         f"{b['mbases_per_s']:.2f} Mbases per batch-second) |")
    if res.get("standin"):
        s = res["standin"]
        lines += ["", "| stand-in basecaller | period mean | p50 | p99 | max | work mean |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for label, r in (("alone", s["alone"]), ("beside the daemon", s["beside"])):
            p, w = r["period"], r["work"]
            lines.append(f"| {label} | {p['mean_ms']:.1f} ms | {p['p50_ms']:.1f} | {p['p99_ms']:.1f} | "
                         f"{p['max_ms']:.1f} | {w['mean_ms']:.1f} ms |")
        c = s["change"]
        lines.append(f"\nPeriod beside / alone: mean {c['mean']:+.1%}, p50 {c['p50']:+.1%}, p99 {c['p99']:+.1%}.")
    if res.get("search"):
        lines += ["", "| pace (Mbases/s) | backlog troughs' slope (reads/s) | finished after last file | latency per "
                  "file mean / max, from landing | from registration | stand-in period mean | kept |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for t in res["search"]:
            tg, tl, ll = t["growth"], t["latency"], t.get("landing_latency")
            period = f"{t['standin']['period']['mean_ms']:.1f} ms" if t.get("standin") else "-"
            landed = f"{ll['mean_s']:.1f} / {ll['max_s']:.1f} s" if ll else "-"
            lines.append(f"| {t['pace']:g} | {tg['slope_reads_per_s']:+.2f} | {_s(tg['drain_s'])} | {landed} | "
                         f"{tl['mean_s']:.1f} / {tl['max_s']:.1f} s | {period} | {'yes' if t['sustained'] else 'no'} |")
        lines.append(f"\nLargest pace kept: {res['largest_pace']} Mbases/s.")
    return "\n".join(lines) + "\n"


def _basecalls(res: Mapping[str, Any], m: Mapping[str, Any]) -> list[str]:
    """The line saying how the daemon got its alignments, where it aligned FASTQ itself."""
    if res.get("basecalls", "bam") == "bam":
        return []
    chosen = m.get("alignment_engine") or {}
    return ["", f"Basecalls as FASTQ, aligned by the daemon: `--align-engine {res.get('align_engine') or 'auto'}`, "
                f"engine {chosen.get('engine', '?')} ({chosen.get('why', '?')}); `streamer call` took the BAM."]


def _diff(d: Mapping[str, int] | None) -> str:
    return f"; {d['daemon_only']} only the daemon's, {d['call_only']} only call's" if d and any(d.values()) else ""


def _s(seconds: float | None) -> str:
    return "did not finish" if seconds is None else f"{seconds:.1f} s"
