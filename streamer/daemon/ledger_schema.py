"""The ledger's SQLite file: its tables, opening it, and upgrading one an older streamer wrote.

What each table holds is said beside its columns; how they make output exactly-once is in
`streamer.daemon.ledger`. A ledger of an older schema is upgraded in place, one version at a
time, each step in its own transaction; one of a newer schema, or another run's, is refused.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from streamer.errors import StreamerError

SCHEMA_VERSION = 5

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,           -- signal | basecalls
    fmt TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    state TEXT NOT NULL,          -- registered | rejected | spare (FASTQ kept for reads their BAM lacks)
    reason TEXT,
    n_reads INTEGER NOT NULL DEFAULT 0,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS reads (
    id INTEGER PRIMARY KEY,
    read_id TEXT NOT NULL UNIQUE,
    signal_file INTEGER,
    basecall_file INTEGER,
    n_bases INTEGER NOT NULL DEFAULT 0,
    since REAL NOT NULL,          -- when the first of its files was registered (wall clock)
    matched REAL,                 -- when the second was
    outcome TEXT,                 -- NULL while open; 'called' or a skip label
    batch INTEGER,
    superseded TEXT,              -- the missing-partner outcome it had before its partner landed late
    spare_file INTEGER            -- FASTQ of a BAM run holding it: its basecalls if no BAM record of it is read
);
CREATE INDEX IF NOT EXISTS reads_matched ON reads(matched) WHERE outcome IS NULL AND matched IS NOT NULL;
CREATE INDEX IF NOT EXISTS reads_waiting ON reads(since) WHERE outcome IS NULL AND matched IS NULL;
CREATE INDEX IF NOT EXISTS reads_basecall_file ON reads(basecall_file);
CREATE TABLE IF NOT EXISTS outputs (name TEXT PRIMARY KEY, offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS modbams (  -- basecall BAMs whose modBAM copy is written (or cannot be)
    file INTEGER PRIMARY KEY,
    output TEXT,                  -- NULL when none could be written
    reason TEXT,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS modcalls (  -- basecall BAMs whose MM/ML calls are in the modkit table
    file INTEGER PRIMARY KEY,
    size INTEGER NOT NULL,        -- the file as it was counted
    mtime_ns INTEGER NOT NULL,
    n_reads INTEGER NOT NULL,
    n_calls INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (  -- the batches' counts summed, and `reads_done`: reads with an outcome
    name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY,
    n_reads INTEGER NOT NULL,
    n_records INTEGER NOT NULL,
    n_calls INTEGER NOT NULL,
    bases INTEGER NOT NULL,
    seconds REAL NOT NULL,        -- time spent on the batch
    latency_sum REAL NOT NULL,    -- over its reads: commit time - time both files were there
    latency_max REAL NOT NULL,
    at REAL NOT NULL
);
"""


class LedgerError(StreamerError):
    """The state folder is in use, belongs to another run, or disagrees with the outputs."""


# reads reported missing a partner that landed late: few, counted at every commit (made after the upgrades, which
# add the column to a version 1 ledger)
SUPERSEDED_INDEX = "CREATE INDEX IF NOT EXISTS reads_superseded ON reads(outcome) WHERE superseded IS NOT NULL"

_UPGRADES = {  # schema version -> the statements that make it the next one
    "1": ("ALTER TABLE reads ADD COLUMN superseded TEXT",),
    "2": (),  # version 3 only adds the modcalls table (made by SCHEMA)
    "3": ("ALTER TABLE reads ADD COLUMN spare_file INTEGER",),
    "4": ("INSERT INTO counters SELECT 'reads_done', count(*) FROM reads WHERE outcome IS NOT NULL HAVING count(*)",
          SUPERSEDED_INDEX),
}


def connect(path: Path) -> sqlite3.Connection:
    """The ledger file, its tables made if new; autocommit, so that `Transaction` delimits each change."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(SCHEMA)
    return db


def check_meta(db: sqlite3.Connection, path: Path, watch_dir: Path, clock: Callable[[], float]) -> None:
    """Stamp a new ledger with its schema and run folder; upgrade an older one; refuse another run's."""
    meta = dict(db.execute("SELECT key, value FROM meta"))
    want = str(watch_dir.resolve())
    if not meta:
        with Transaction(db):
            db.executemany("INSERT INTO meta VALUES (?, ?)", [
                ("schema_version", str(SCHEMA_VERSION)), ("watch_dir", want), ("created", str(clock())),
            ])
            db.execute(SUPERSEDED_INDEX)
        return
    version = meta.get("schema_version")
    while version in _UPGRADES:
        with Transaction(db):
            for statement in _UPGRADES[version]:
                db.execute(statement)
            version = str(int(version) + 1)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
    if version != str(SCHEMA_VERSION):
        raise LedgerError(f"{path}: ledger schema {version}, this streamer writes {SCHEMA_VERSION}; "
                          "use a new state folder")
    if meta.get("watch_dir") != want:
        raise LedgerError(f"{path}: this state folder belongs to the run in {meta.get('watch_dir')}, "
                          f"not {want}; give each run its own output or state folder")


class Transaction:
    """`BEGIN IMMEDIATE` … `COMMIT`, or `ROLLBACK` on an exception."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, *exc) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
