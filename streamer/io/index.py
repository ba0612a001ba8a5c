"""Read id -> signal file index (what `f5c index` builds), cached beside the reads file, or in
the user's cache folder where that folder cannot be written.

The cache records each signal file's size and modification time; it is rebuilt when the
set of signal files or any of them changes, so a stale index is never used. It also keeps the run
metadata of the first file (which tells the pore), so that a run on a cached index opens no signal
file, nor imports a format's library, before its readers do.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from streamer.errors import InputError
from streamer.io.poretype import run_metadata
from streamer.io.signal import find_signal_files, signal_read_ids
from streamer.paths import user_cache_dir

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".streamer-index.tsv"


def index_path_for(reads_file: str | Path) -> Path:
    """Where the index of `reads_file` is kept: beside it, or in the user's cache folder when its
    folder cannot be written (read-only data, someone else's folder), or when one is there already."""
    beside = Path(str(reads_file) + INDEX_SUFFIX)
    if beside.is_file() or os.access(beside.parent, os.W_OK):
        return beside
    return _cached_path(reads_file)


def _cached_path(reads_file: str | Path) -> Path:
    resolved = Path(reads_file).resolve()
    key = hashlib.sha256(str(resolved).encode()).hexdigest()[:16]
    return user_cache_dir() / "read-index" / f"{resolved.name}.{key}{INDEX_SUFFIX}"


def _fingerprint(files: list[Path]) -> list[list]:
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


class SignalIndex:
    """Where each read's signal lives; also the files that could not be read, with the reason, and the run
    metadata of the first file holding reads (`first_run_metadata`)."""

    def __init__(self, paths: dict[str, Path], fingerprint: list[list], bad_files: dict[str, str],
                 first_metadata: dict[str, str] | None = None):  # fmt: skip
        self.paths = paths
        self.fingerprint = fingerprint
        self.bad_files = bad_files
        self._first_metadata = first_metadata  # None: not read yet (a cache written before it was kept)

    def first_run_metadata(self) -> tuple[Path, dict[str, str]] | None:
        """The first file holding reads and its run metadata (`streamer.io.poretype`), read once; None
        without reads."""
        first = next(iter(self.paths.values()), None)
        if first is None:
            return None
        if self._first_metadata is None:
            self._first_metadata = run_metadata(first)
        return first, self._first_metadata

    def lookup(self, read_id: str) -> Path | None:
        return self.paths.get(read_id)

    def suffixes(self) -> set[str]:
        """The signal files' suffixes (`.pod5`...): the formats a run reads."""
        return {path.suffix for path in self.paths.values()}

    def __len__(self) -> int:
        return len(self.paths)

    @classmethod
    def build(cls, files: list[Path]) -> "SignalIndex":
        paths: dict[str, Path] = {}
        bad: dict[str, str] = {}
        for f in files:
            try:
                ids = signal_read_ids(f)
            except InputError as exc:
                bad[str(f)] = exc.reason
                continue
            for rid in ids:
                paths.setdefault(rid, f.resolve())
        idx = cls(paths, _fingerprint(files), bad)
        idx.first_run_metadata()  # kept with the cache
        return idx

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as fh:
            header = {"files": self.fingerprint, "bad_files": self.bad_files, "first_metadata": self._first_metadata}
            fh.write("#" + json.dumps(header) + "\n")
            for rid, p in self.paths.items():
                fh.write(f"{rid}\t{p}\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "SignalIndex":
        with open(path) as fh:
            header = json.loads(fh.readline()[1:])
            paths = {}
            for line in fh:
                rid, _, p = line.rstrip("\n").partition("\t")
                paths[rid] = Path(p)
        return cls(paths, header["files"], header.get("bad_files", {}), header.get("first_metadata"))


def open_index(reads_file: str | Path, signal: list[str | Path] | None = None) -> SignalIndex:
    """The index for `reads_file`: loaded from its cache if still valid, else built from `signal`."""
    reads = Path(reads_file)
    if not reads.is_file():
        raise InputError(reads_file, "a folder, not a reads file" if reads.is_dir() else "no such file")
    cache = index_path_for(reads_file)
    files = find_signal_files(signal) if signal else None
    if cache.is_file():
        try:
            idx = SignalIndex.load(cache)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("%s: unreadable index cache (%s); rebuilding", cache, exc)
        else:
            if files is None or idx.fingerprint == _fingerprint(files):
                return idx
            log.info("%s: signal files changed; rebuilding the index", cache)
    if files is None:
        raise InputError(reads_file, "no signal index: pass --signal DIR (or run `streamer index`)")
    idx = SignalIndex.build(files)
    if cache.parent != Path(reads_file).parent:
        log.info("%s: its folder is read-only: the read index is kept in %s", reads_file, cache.parent)
    try:
        idx.save(cache)
    except OSError as exc:
        log.warning("%s: cannot cache the index (%s); continuing without", cache, exc.strerror)
    return idx
