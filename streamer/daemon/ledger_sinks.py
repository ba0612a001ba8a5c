"""What the daemon's output sinks keep in its ledger (`streamer.sinks.SinkLedger`).

The modBAM copies made (or that could not be), the basecall BAMs whose modified-base calls are
counted into the modkit table, and the sinks' own values in the meta table: each recorded in
one transaction of the ledger, so a sink restores from it what it had committed.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path

from streamer.daemon.ledger_schema import Transaction


class SinkRecords:
    """The sinks' part of `streamer.daemon.ledger.Ledger`, over its database."""

    _db: sqlite3.Connection
    _clock: Callable[[], float]

    def _tx(self) -> Transaction:
        return Transaction(self._db)

    def _rows(self, sql: str, params: tuple = ()) -> list:
        """What a `json_group_array` query gives, decoded: one step of the database for all its rows, each
        of which would let go of the GIL (`streamer.daemon.ledger`)."""
        return json.loads(self._db.execute(sql, params).fetchone()[0])

    # ------------------------------------------------------------------ modBAM copies

    def finished_bams(self) -> list[tuple[int, Path]]:
        """(file id, path) of registered basecall BAMs with every read done and no modBAM recorded yet."""
        rows = self._db.execute(
            "SELECT f.id, f.path FROM files f WHERE f.kind = 'basecalls' AND f.fmt = 'bam' "
            "AND f.state = 'registered' AND f.id NOT IN (SELECT file FROM modbams) AND NOT EXISTS "
            "(SELECT 1 FROM reads r WHERE r.basecall_file = f.id AND r.outcome IS NULL) ORDER BY f.id")
        return [(fid, Path(p)) for fid, p in rows]

    def reads_of_file(self, file_id: int) -> set[str]:
        return set(self._rows("SELECT json_group_array(read_id) FROM reads WHERE basecall_file = ?", (file_id,)))

    def reads_awaiting_modbam(self) -> set[str]:
        """Reads of basecall BAMs whose modBAM is not written yet (their calls are still needed)."""
        return set(self._rows(
            "SELECT json_group_array(r.read_id) FROM reads r JOIN files f ON f.id = r.basecall_file "
            "WHERE f.fmt = 'bam' AND f.state = 'registered' AND f.id NOT IN (SELECT file FROM modbams)"))

    def record_modbam(self, file_id: int, output: Path | None, reason: str | None = None) -> None:
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO modbams VALUES (?, ?, ?, ?)",
                             (file_id, None if output is None else str(output), reason, self._clock()))

    def modbam_counts(self) -> dict[str, int]:
        written, failed = self._db.execute(
            "SELECT count(output), count(*) - count(output) FROM modbams").fetchone()
        return {"written": written, "not_written": failed}

    # ------------------------------------------------------------------ modified-base calls

    def meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def modcall_files(self) -> list[tuple[int, Path, int, int]]:
        """(file id, path, size, mtime_ns) of the BAMs counted into the modkit table, in the order counted
        (those with calls: not the ones recorded unreadable, with a negative call count)."""
        rows = self._db.execute("SELECT m.file, f.path, m.size, m.mtime_ns FROM modcalls m JOIN files f ON "
                                "f.id = m.file WHERE m.size = f.size AND m.mtime_ns = f.mtime_ns AND m.n_calls > 0 "
                                "ORDER BY m.at, m.file")
        return [(fid, Path(p), size, mtime) for fid, p, size, mtime in rows]

    def uncounted_bams(self) -> list[tuple[int, Path, int, int, bool]]:
        """Registered basecall BAMs not (or no longer, as they are now) counted into the modkit table;
        the last field says whether an earlier state of the file was counted."""
        rows = self._db.execute(
            "SELECT f.id, f.path, f.size, f.mtime_ns, m.file IS NOT NULL FROM files f "
            "LEFT JOIN modcalls m ON m.file = f.id "
            "WHERE f.kind = 'basecalls' AND f.fmt = 'bam' AND f.state = 'registered' AND (m.file IS NULL OR "
            "m.size != f.size OR m.mtime_ns != f.mtime_ns) ORDER BY f.id")
        return [(fid, Path(p), size, mtime, bool(old)) for fid, p, size, mtime, old in rows]

    def record_modcalls(self, file_id: int, size: int, mtime_ns: int, n_reads: int, n_calls: int) -> None:
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO modcalls VALUES (?, ?, ?, ?, ?, ?)",
                             (file_id, size, mtime_ns, n_reads, n_calls, self._clock()))

    def forget_modcalls(self, file_ids: Iterable[int]) -> None:
        with self._tx():
            self._db.executemany("DELETE FROM modcalls WHERE file = ?", ((f,) for f in file_ids))

    def modcall_counts(self) -> dict[str, int]:
        files, reads, calls, unreadable = self._db.execute(
            "SELECT count(*) FILTER (WHERE n_calls >= 0), coalesce(sum(n_reads), 0), "
            "coalesce(sum(n_calls) FILTER (WHERE n_calls >= 0), 0), count(*) FILTER (WHERE n_calls < 0) "
            "FROM modcalls").fetchone()
        return {"files": files, "reads": reads, "calls": calls, "unreadable_files": unreadable}
