"""The ledger: an SQLite file in the state folder recording every file and every read of a run.

It is what makes output exactly-once. A batch's rows are appended to the output files and
flushed first; then one transaction marks the batch's reads done together with the new end
offset of every output file and the counters. After a crash, `Journal` cuts each
output back to its committed offset, so rows written by an uncommitted batch vanish, and
those reads, still open in the ledger, are processed again. No read twice, none missing.

Reads live here from the moment either of their files is registered, so the join of signal
and basecalls survives a restart without reading the files again; a read is "matched" once
both are known, and "done" once it has an outcome: "called" or a skip reason.

A read reported missing its partner ("no signal", "no basecall") is reopened when that
partner lands after all: in the transaction that registers the late file, the report moves
to `superseded`, its counters are taken back, and the read is matched like any other; the
batch that processes it commits its new outcome. So a read has one outcome at any time, and
a kill at any point leaves it either reported or open, never both, never called twice.

A file's or a batch's reads go in and come out as one JSON value, in one statement: SQLite's
Python module lets go of the GIL for every row it steps through, and the engine that asks runs
beside threads that hold it; a thousand rows then cost a thousand waits for it, seconds on a
busy machine (`benchmarks/bench_ledger.py`).

The tables and the upgrades of an older ledger are in `streamer.daemon.ledger_schema`; what the
output sinks keep here (modBAM copies, modified-base counts) in `streamer.daemon.ledger_sinks`.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from streamer.daemon.ledger_schema import LedgerError, check_meta, connect
from streamer.daemon.ledger_sinks import SinkRecords
from streamer.skips import Skip

DONE = "reads_done"  # the counter of reads with an outcome

# a file's reads, (read id, bases) pairs in one JSON parameter after the file's id and the time, as the rows of an
# INSERT (`WHERE true` keeps SQLite from reading its upsert's ON as a join's)
_EACH_READ = ("SELECT json_extract(value, '$[0]'), ?, json_extract(value, '$[1]'), ? FROM json_each(?) "
              "WHERE true ORDER BY key")


@dataclass(frozen=True)
class Pick:
    """A matched read ready for a batch: where its signal and its basecalls are."""

    read_id: str
    n_bases: int
    signal_path: Path
    basecall_path: Path
    basecall_fmt: str
    matched: float  # wall clock: when its second file was registered
    number: int  # the read's row id: eventalign's read_index when read names are not printed
    superseded: str | None = None  # its earlier "no signal"/"no basecall" report, if its partner came late
    spare_path: Path | None = None  # the FASTQ that holds it too, if its basecall file fails when read again
    spare_fmt: str = ""


@dataclass(frozen=True)
class BatchRecord:
    """What one batch did, for throughput and latency in the summary."""

    n_reads: int
    n_records: int
    n_calls: int
    bases: int
    seconds: float
    latency_sum: float
    latency_max: float


@dataclass(frozen=True)
class Waiting:
    """An open read that has only one of its two files."""

    read_id: str
    has_signal: bool
    path: Path  # the file it has


@dataclass(frozen=True)
class Registered:
    """What registering a file did."""

    n_reads: int
    newly_matched: int
    duplicates: int  # read ids another file of the same kind already had
    late: int  # reads already reported as missing this file: reopened, to be processed now
    reopened_bams: tuple[int, ...] = ()  # basecall BAMs (file ids) whose modBAM copy lacks those reads


class Ledger(SinkRecords):
    """One per state folder (an exclusive lock keeps a second daemon out)."""

    def __init__(self, state_dir: Path, *, watch_dir: Path, clock=time.time):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock_fd = os.open(self.state_dir / "ledger.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise LedgerError(f"{self.state_dir}: another streamer daemon is using this state folder") from None
        self.path = self.state_dir / "ledger.sqlite"
        self._db = connect(self.path)
        check_meta(self._db, self.path, Path(watch_dir), clock)
        self._last_matched: tuple[tuple, tuple[list[Pick], bool]] | None = None  # `matched`'s last question and answer
        self._file_names: dict[int, tuple[Path, str]] = {}  # file id -> (path, format), as asked
        self._totals = self._sum_batches()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
            os.close(self._lock_fd)

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ files

    def is_known(self, path: Path, size: int, mtime_ns: int) -> bool:
        """Registered (whatever happened to it since), or rejected as it is now."""
        row = self._db.execute("SELECT state, size, mtime_ns FROM files WHERE path = ?", (str(path),)).fetchone()
        if row is None:
            return False
        return row[0] != "rejected" or (row[1], row[2]) == (size, mtime_ns)

    def _upsert_file(self, path: Path, kind: str, fmt: str, size: int, mtime_ns: int, state: str,
                     reason: str | None, n_reads: int) -> int:
        self._db.execute(
            "INSERT INTO files (path, kind, fmt, size, mtime_ns, state, reason, n_reads, at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(path) DO UPDATE SET kind = excluded.kind, "
            "fmt = excluded.fmt, size = excluded.size, mtime_ns = excluded.mtime_ns, state = excluded.state, "
            "reason = excluded.reason, n_reads = excluded.n_reads, at = excluded.at",
            (str(path), kind, fmt, size, mtime_ns, state, reason, n_reads, self._clock()))
        return self._db.execute("SELECT id FROM files WHERE path = ?", (str(path),)).fetchone()[0]

    def reject_file(self, path: Path, kind: str, fmt: str, size: int, mtime_ns: int, reason: str,
                    spares: Iterable[Path] = ()) -> dict[Path, int]:
        """Set the file aside; in the same transaction, the reads of the `spares` (FASTQ holding
        its reads) take their basecalls from them. How many reads each spare gave."""
        with self._tx():
            self._upsert_file(path, kind, fmt, size, mtime_ns, "rejected", reason, 0)
            return self._use_spares([str(p) for p in spares])

    def register_spare_file(self, path: Path, fmt: str, size: int, mtime_ns: int, reads: list[tuple[str, int]],
                            use: bool = False) -> int:
        """A FASTQ of a run that writes BAM: its reads' basecalls wait here until a BAM record of
        theirs is read (then this copy is not used), or none can be (`use`, or `use_spares`).
        `reads`: (read id, number of bases). How many reads it gave, when `use`."""
        with self._tx():
            fid = self._upsert_file(path, "basecalls", fmt, size, mtime_ns, "spare", None, len(reads))
            self._db.execute(
                f"INSERT INTO reads (read_id, spare_file, n_bases, since) {_EACH_READ} "
                "ON CONFLICT(read_id) DO UPDATE SET spare_file = excluded.spare_file, "
                "n_bases = CASE WHEN basecall_file IS NULL THEN excluded.n_bases ELSE n_bases END "
                "WHERE spare_file IS NULL", (fid, self._clock(), json.dumps(reads)))
            return self._use_spares([str(path)]).get(path, 0) if use else 0

    def use_spares(self) -> dict[Path, int]:
        """Every read with no BAM record read takes its basecalls from its spare FASTQ (end of the run)."""
        with self._tx():
            return self._use_spares(None)

    def spare_files(self) -> list[Path]:
        return [Path(p) for (p,) in self._db.execute("SELECT path FROM files WHERE state = 'spare' ORDER BY id")]

    def _use_spares(self, paths: list[str] | None) -> dict[Path, int]:
        """Reads of these spare files (all if None) that have no basecalls take theirs from them:
        open ones, and those already reported without basecalls (reopened, as when a late file
        lands). A file that gave any becomes a registered source. Inside a transaction."""
        missing = Skip.NO_BASECALL.label
        used: dict[Path, int] = {}
        spares = self._db.execute("SELECT id, path FROM files WHERE state = 'spare' AND (? IS NULL OR path IN "
                                  "(SELECT value FROM json_each(?)))",
                                  (None if paths is None else 1, json.dumps(paths or [])))
        for fid, path in list(spares):
            n = self._db.execute(
                "UPDATE reads SET basecall_file = spare_file, matched = CASE WHEN signal_file IS NOT NULL THEN ? END "
                "WHERE spare_file = ? AND basecall_file IS NULL AND (outcome IS NULL OR outcome = ?)",
                (self._clock(), fid, missing)).rowcount
            self._reopen_late("basecall_file", fid, missing)
            if n:
                self._db.execute("UPDATE files SET state = 'registered' WHERE id = ?", (fid,))
                used[Path(path)] = n
        return used

    def take_spares(self, read_ids: Iterable[str]) -> dict[Path, list[str]]:
        """These open reads take their basecalls from their spare FASTQ from now on (their basecall
        file failed when read again); those without one are left as they are. The reads switched, by spare."""
        switched: dict[Path, list[str]] = {}
        with self._tx():
            rows = self._db.execute(
                "SELECT r.read_id, f.id, f.path FROM reads r JOIN files f ON f.id = r.spare_file "
                "WHERE r.read_id IN (SELECT value FROM json_each(?)) AND r.outcome IS NULL "
                "AND r.basecall_file != r.spare_file ORDER BY r.id", (json.dumps(list(read_ids)),)).fetchall()
            self._db.executemany("UPDATE reads SET basecall_file = spare_file WHERE read_id = ?",
                                 ((rid,) for rid, _, _ in rows))
            self._db.executemany("UPDATE files SET state = 'registered' WHERE id = ?", {(fid,) for _, fid, _ in rows})
        for rid, _, path in rows:
            switched.setdefault(Path(path), []).append(rid)
        return switched

    def register_signal_file(self, path: Path, fmt: str, size: int, mtime_ns: int,
                             read_ids: list[str]) -> Registered:
        return self._register(path, "signal", fmt, size, mtime_ns, [(r, 0) for r in read_ids])

    def register_basecall_file(self, path: Path, fmt: str, size: int, mtime_ns: int,
                               reads: list[tuple[str, int]]) -> Registered:
        """`reads`: (read id, number of bases)."""
        return self._register(path, "basecalls", fmt, size, mtime_ns, reads)

    def _register(self, path: Path, kind: str, fmt: str, size: int, mtime_ns: int,
                  reads: list[tuple[str, int]]) -> Registered:
        mine, other = ("signal_file", "basecall_file") if kind == "signal" else ("basecall_file", "signal_file")
        missing = (Skip.NO_SIGNAL if kind == "signal" else Skip.NO_BASECALL).label
        now = self._clock()
        with self._tx():
            fid = self._upsert_file(path, kind, fmt, size, mtime_ns, "registered", None, len(reads))
            bases = "n_bases = excluded.n_bases, " if kind == "basecalls" else ""
            self._db.execute(
                f"INSERT INTO reads (read_id, {mine}, n_bases, since) {_EACH_READ} "
                f"ON CONFLICT(read_id) DO UPDATE SET {mine} = excluded.{mine}, {bases}"
                f"matched = CASE WHEN {other} IS NOT NULL THEN excluded.since ELSE NULL END "
                f"WHERE {mine} IS NULL",
                (fid, now, json.dumps(reads)))
            late, bams = self._reopen_late(mine, fid, missing)
            mine_count, matched = self._db.execute(
                f"SELECT count(*), count(matched) FILTER (WHERE outcome IS NULL) FROM reads WHERE {mine} = ?",
                (fid,)).fetchone()
        return Registered(len(reads), matched, len(reads) - mine_count, late, bams)

    def _reopen_late(self, mine: str, fid: int, missing: str) -> tuple[int, tuple[int, ...]]:
        """Reopen the reads of file `fid` reported missing it, inside the registering transaction.

        Their report becomes `superseded` and its counters (one record, one skip) are taken
        back, so the counts hold each read once; a basecall BAM whose modBAM copy was made
        without them loses its record, to be copied again once they are done.
        """
        where = f"{mine} = ? AND outcome = ?"
        late = self._db.execute(f"SELECT count(*) FROM reads WHERE {where}", (fid, missing)).fetchone()[0]
        if not late:
            return 0, ()
        bams = tuple(b for (b,) in self._db.execute(
            f"SELECT DISTINCT m.file FROM reads r JOIN modbams m ON m.file = r.basecall_file WHERE {where}",
            (fid, missing)))
        self._db.executemany("DELETE FROM modbams WHERE file = ?", ((b,) for b in bams))
        self._db.execute(f"UPDATE reads SET superseded = outcome, outcome = NULL, batch = NULL WHERE {where}",
                         (fid, missing))
        self._db.executemany("UPDATE counters SET value = value - ? WHERE name = ?",
                             [(late, "records_in"), (late, f"skipped.{missing}"), (late, DONE)])
        self._db.execute("DELETE FROM counters WHERE value = 0")
        return late, bams

    def rejected_files(self) -> list[tuple[str, str, str]]:
        """(path, kind, reason) of every file set aside."""
        return list(self._db.execute("SELECT path, kind, reason FROM files WHERE state = 'rejected' ORDER BY path"))

    def files_under(self, folder: Path) -> dict[str, int]:
        """Files under `folder` accounted for (registered, set aside or kept as spares), by format."""
        prefix = os.path.join(str(folder), "")
        return dict(self._db.execute("SELECT fmt, count(*) FROM files WHERE substr(path, 1, ?) = ? GROUP BY fmt",
                                     (len(prefix), prefix)))

    def file_counts(self) -> dict[str, int]:
        return {f"{kind}_{state}": n for kind, state, n in
                self._db.execute("SELECT kind, state, count(*) FROM files GROUP BY kind, state")}

    # ------------------------------------------------------------------ reads

    def matched(self, max_reads: int, max_bases: int, after: Pick | None = None) -> tuple[list[Pick], bool]:
        """The oldest matched reads (those after the pick `after`, in the order reads are picked: the
        batches in flight are passed over), up to `max_reads` reads and (past the first) `max_bases`
        bases; and whether that filled a batch."""
        key = (-1.0, -1) if after is None else (after.matched, after.number)
        # the engine asks again and again while batches are in flight: the same question of an unchanged
        # database (`total_changes` counts every row written) has the same answer
        asked = (max_reads, max_bases, key, self._db.total_changes)
        if self._last_matched is not None and self._last_matched[0] == asked:
            picks, full = self._last_matched[1]
            return list(picks), full
        picks, full = self._matched(max_reads, max_bases, key)
        self._last_matched = (asked, (picks, full))
        return list(picks), full

    def _matched(self, max_reads: int, max_bases: int, key: tuple[float, int]) -> tuple[list[Pick], bool]:
        picks: list[Pick] = []
        bases = 0
        # only the reads up to the first past `max_bases` come back (bases summed in the database, without
        # the GIL): a batch's few hundred, not K; `matched` as text with every digit: JSON's numbers keep
        # 15, and it is a key
        rows = self._rows(
            "SELECT json_group_array(json_array(read_id, n_bases, signal_file, basecall_file, "
            "printf('%!.17g', matched), id, superseded, nullif(spare_file, basecall_file))) FROM "
            "(SELECT *, sum(n_bases) OVER (ORDER BY matched, id ROWS UNBOUNDED PRECEDING) - n_bases AS before FROM "
            "(SELECT * FROM reads WHERE outcome IS NULL AND matched IS NOT NULL AND (matched, id) > (?, ?) "
            "ORDER BY matched, id LIMIT ?)) WHERE before <= ?", (*key, max_reads, max_bases))
        rows.sort(key=lambda r: (float(r[4]), r[5]))
        files = self._files_by_id({fid for r in rows for fid in (r[2], r[3], r[7]) if fid is not None})
        for rid, n, signal, basecalls, matched, number, superseded, spare in rows:
            if picks and bases + n > max_bases:
                return picks, True
            (sp, _), (bp, fmt) = files[signal], files[basecalls]
            xp, xfmt = files[spare] if spare is not None else (None, "")
            picks.append(Pick(rid, n, sp, bp, fmt, float(matched), number, superseded, xp, xfmt))
            bases += n
        return picks, len(picks) == max_reads or bases >= max_bases

    def _files_by_id(self, ids: set[int]) -> dict[int, tuple[Path, str]]:
        """(path, format) of these files, each asked of the database once: a file's row keeps both."""
        missing = [i for i in ids if i not in self._file_names]
        if missing:
            for fid, path, fmt in self._rows("SELECT json_group_array(json_array(id, path, fmt)) FROM files "
                                             "WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(missing),)):
                self._file_names[fid] = (Path(path), fmt)
        return {i: self._file_names[i] for i in ids}

    def waiting(self, since_before: float | None = None) -> list[Waiting]:
        """Open reads with one file only, first registered before `since_before` (all if None)."""
        cutoff = float("inf") if since_before is None else since_before
        rows = self._db.execute(
            "SELECT r.read_id, r.signal_file IS NOT NULL, f.path FROM reads r "
            "JOIN files f ON f.id = coalesce(r.signal_file, r.basecall_file) "
            "WHERE r.outcome IS NULL AND r.matched IS NULL AND r.since < ? ORDER BY r.id", (cutoff,))
        return [Waiting(rid, bool(s), Path(p)) for rid, s, p in rows]

    def open_reads_of(self, basecall_path: Path) -> set[str]:
        """Open reads whose basecalls are in this file (to reload them after a restart)."""
        return set(self._rows(
            "SELECT json_group_array(r.read_id) FROM reads r JOIN files f ON f.id = r.basecall_file "
            "WHERE f.path = ? AND r.outcome IS NULL", (str(basecall_path),)))

    def read_counts(self) -> dict[str, int]:
        """Reads by state, asked at every commit: the open ones counted over their partial indexes and the done
        ones kept as a counter, so that the cost follows the reads still open, not the run's millions done."""
        matched = self._db.execute(
            "SELECT count(*) FROM reads WHERE outcome IS NULL AND matched IS NOT NULL").fetchone()[0]
        signal, basecalls = self._db.execute(
            "SELECT count(signal_file), count(basecall_file) FROM reads WHERE outcome IS NULL AND matched IS NULL"
        ).fetchone()
        done = self._db.execute("SELECT coalesce(sum(value), 0) FROM counters WHERE name = ?", (DONE,)).fetchone()[0]
        return {"done": done, "matched": matched, "waiting_for_basecalls": signal, "waiting_for_signal": basecalls}

    def recovered(self) -> int:
        """Reads done after all, though once reported missing their partner (it landed late): few, indexed."""
        return self._db.execute(
            "SELECT count(*) FROM reads WHERE superseded IS NOT NULL AND outcome IS NOT NULL").fetchone()[0]

    def outcome(self, read_id: str) -> str | None:
        row = self._db.execute("SELECT outcome FROM reads WHERE read_id = ?", (read_id,)).fetchone()
        return row[0] if row else None

    # ------------------------------------------------------------------ batches

    def offsets(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT name, offset FROM outputs"))

    def counters(self) -> dict[str, int]:
        """The batches' counts summed (`reads_done` is `read_counts`')."""
        return dict(self._db.execute("SELECT name, value FROM counters WHERE name != ? ORDER BY name", (DONE,)))

    def batch_totals(self) -> dict[str, float]:
        """The batches' totals, summed from the table once and then kept as each commits (a day's run holds
        a million batches: the summary asks at every commit)."""
        return dict(self._totals)

    def _sum_batches(self) -> dict[str, float]:
        row = self._db.execute(
            "SELECT count(*), coalesce(sum(n_reads), 0), coalesce(sum(bases), 0), coalesce(sum(seconds), 0), "
            "coalesce(sum(latency_sum), 0), coalesce(max(latency_max), 0) FROM batches").fetchone()
        return dict(zip(("batches", "reads", "bases", "seconds", "latency_sum", "latency_max"), row))

    def commit(self, outcomes: Iterable[tuple[str, str]], offsets: Mapping[str, int],
               counters: Mapping[str, int], batch: BatchRecord | None = None) -> int | None:
        """One transaction: reads done, output offsets, counters, and the batch record if any;
        returns the batch id."""
        with self._tx():
            bid = None
            if batch is not None:
                cur = self._db.execute(
                    "INSERT INTO batches (n_reads, n_records, n_calls, bases, seconds, latency_sum, latency_max, at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (batch.n_reads, batch.n_records, batch.n_calls, batch.bases, batch.seconds, batch.latency_sum,
                     batch.latency_max, self._clock()))
                bid = cur.lastrowid
            done = sum(self._db.execute("UPDATE reads SET outcome = ?, batch = ? WHERE read_id IN (SELECT value FROM "
                                        "json_each(?)) AND outcome IS NULL", (outcome, bid, json.dumps(ids))).rowcount
                       for outcome, ids in _by_outcome(outcomes).items())
            counters = {**counters, DONE: counters.get(DONE, 0) + done}
            self._db.executemany(
                "INSERT INTO outputs VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET offset = excluded.offset",
                offsets.items())
            self._db.executemany(
                "INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                ((k, v) for k, v in counters.items() if v))
        if batch is not None:
            t = self._totals
            t.update(batches=t["batches"] + 1, reads=t["reads"] + batch.n_reads, bases=t["bases"] + batch.bases,
                     seconds=t["seconds"] + batch.seconds, latency_sum=t["latency_sum"] + batch.latency_sum,
                     latency_max=max(t["latency_max"], batch.latency_max))
        return bid



def _by_outcome(outcomes: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """The read ids of each outcome; a read given two keeps its first."""
    first: dict[str, str] = {}
    for rid, outcome in outcomes:
        first.setdefault(rid, outcome)
    by: dict[str, list[str]] = {}
    for rid, outcome in first.items():
        by.setdefault(outcome, []).append(rid)
    return by
