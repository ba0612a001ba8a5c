"""What the daemon's ledger costs its engine thread per file and per batch, alone and beside threads that
hold the GIL, as the daemon's stages do between their kernels.

SQLite's Python module lets go of the GIL around every step of a statement: every row an `executemany`
writes and every row a query gives. A thread that must wait for the GIL back waits up to the switch
interval (5 ms) each time another thread holds it, so per-row steps cost the engine about that much a
row on a busy machine. The ledger takes a file's or a batch's reads in and out in one statement each
(`streamer.daemon.ledger`); the rows "per row" do the same work a step a row, for comparison in the same run.

Synthetic reads (no input files): `--files` signal files and their basecall files of `--reads` reads,
each registered, its batch picked and committed. Reported per file, mean seconds, each with `--busy`
threads spinning in Python beside it and with none:

    python benchmarks/bench_ledger.py --files 5 --reads 1000 --busy 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from streamer.daemon.ledger import Ledger


@contextmanager
def busy(n: int):
    """`n` threads running Python (holding the GIL but for its switch interval) while the block runs."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for _ in range(10_000):
                x += 1

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()


def one_file(ledger: Ledger, i: int, reads: int, times: dict[str, list[float]]) -> None:
    """A signal file and a BAM of `reads` reads registered, their batch picked and committed."""
    ids = [str(uuid.uuid4()) for _ in range(reads)]
    signal, bam = Path(f"/run/pod5/f{i}.pod5"), Path(f"/run/bam/f{i}.bam")
    steps: list[tuple[str, Callable[[], object]]] = [
        ("register signal", lambda: ledger.register_signal_file(signal, "pod5", 1, 1, ids)),
        ("register basecalls", lambda: ledger.register_basecall_file(bam, "bam", 1, 1, [(r, 2000) for r in ids])),
        ("open reads of the BAM", lambda: ledger.open_reads_of(bam)),
        ("pick a batch", lambda: ledger.matched(reads, 10**12)),
    ]
    for label, step in steps:
        t = time.perf_counter()
        got = step()
        times[label].append(time.perf_counter() - t)
    picks, _ = got
    t = time.perf_counter()
    ledger.commit([(p.read_id, "called") for p in picks], {"meth.tsv": i}, {"called": len(picks)})
    times["commit the batch"].append(time.perf_counter() - t)


def per_row(ledger_path: Path, reads: int, times: dict[str, list[float]]) -> None:
    """The same reads written by `executemany` and read back by stepping a query, a step a row."""
    import sqlite3

    db = sqlite3.connect(ledger_path, isolation_level=None)
    db.execute("CREATE TEMP TABLE t (read_id TEXT PRIMARY KEY, n INTEGER)")
    rows = [(str(uuid.uuid4()), 2000) for _ in range(reads)]
    t = time.perf_counter()
    db.execute("BEGIN")
    db.executemany("INSERT INTO t VALUES (?, ?)", rows)
    db.execute("COMMIT")
    times["per row: insert"].append(time.perf_counter() - t)
    t = time.perf_counter()
    db.execute("SELECT read_id, n FROM t").fetchall()
    times["per row: query"].append(time.perf_counter() - t)
    t = time.perf_counter()
    json.loads(db.execute("SELECT json_group_array(json_array(read_id, n)) FROM t").fetchone()[0])
    times["one statement: query"].append(time.perf_counter() - t)
    db.close()


def measure(files: int, reads: int, threads: int) -> dict[str, float]:
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as state:
        ledger = Ledger(Path(state), watch_dir=Path("/run"))
        try:
            for label in ("register signal", "register basecalls", "open reads of the BAM", "pick a batch",
                          "commit the batch", "per row: insert", "per row: query", "one statement: query"):
                times[label] = []
            with busy(threads):
                for i in range(files):
                    one_file(ledger, i, reads, times)
                    per_row(ledger.path, reads, times)
        finally:
            ledger.close()
    return {label: statistics.mean(v) for label, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=5)
    ap.add_argument("--reads", type=int, default=1000)
    ap.add_argument("--busy", type=int, default=2, help="threads spinning in Python beside the ledger")
    args = ap.parse_args()
    alone = measure(args.files, args.reads, 0)
    beside = measure(args.files, args.reads, args.busy)
    print(f"mean seconds per file of {args.reads} reads ({args.files} files)")
    print(f"| step | alone | beside {args.busy} busy threads |")
    print("|---|---|---|")
    for label in alone:
        print(f"| {label} | {alone[label]:.4f} | {beside[label]:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
